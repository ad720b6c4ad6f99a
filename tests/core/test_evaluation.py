"""pass@k against exact binomial fractions; avg@k."""
import math
from fractions import Fraction

import chex
import numpy as np
import pytest

from jaxrl_llm import core

VARIANTS = dict(with_jit=True, without_jit=True)


def exact_pass_at_k(n, c, k):
    return float(1 - Fraction(math.comb(n - c, k), math.comb(n, k)))


class PassAtKTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_hand_values(self):
        n = np.array([5, 5, 5, 5, 10])
        c = np.array([2, 2, 4, 0, 10])
        np.testing.assert_allclose(self.variant(lambda a, b: core.pass_at_k(a, b, 1))(n, c),
                                   [0.4, 0.4, 0.8, 0.0, 1.0], rtol=1e-6)
        # k = 2: 1 - C(3,2)/C(5,2) = 0.7; n - c = 1 < 2 -> 1; c = 0 -> 0
        np.testing.assert_allclose(self.variant(lambda a, b: core.pass_at_k(a, b, 2))(n, c),
                                   [0.7, 0.7, 1.0, 0.0, 1.0], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_matches_exact_fractions_for_large_n(self):
        rng = np.random.default_rng(0)
        n = rng.integers(16, 1000, 64)
        c = rng.integers(0, n + 1)
        for k in (1, 8, 16):
            out = self.variant(lambda a, b: core.pass_at_k(a, b, k))(n, c)
            expected = [exact_pass_at_k(int(a), int(b), k) for a, b in zip(n, c)]
            np.testing.assert_allclose(out, expected, atol=2e-6)

    @chex.variants(**VARIANTS)
    def test_avg_at_k(self):
        scores = np.array([[1, 0, 1, 1], [0, 0, 0, 0]], np.float32)
        np.testing.assert_allclose(self.variant(core.avg_at_k)(scores), [0.75, 0.0])


def test_invalid_arguments():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        core.pass_at_k(np.array([3]), np.array([4]), 1)
    with pytest.raises(ValueError, match="n >= k"):
        core.pass_at_k(np.array([3]), np.array([1]), 4)
    with pytest.raises(ValueError, match="positive Python int"):
        core.pass_at_k(np.array([3]), np.array([1]), 0)
