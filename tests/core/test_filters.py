"""Zero-variance filter, truncation masking and the DAPO overlong penalty."""
import chex
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import lengths_to_mask

VARIANTS = dict(with_jit=True, without_jit=True)


class FiltersTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_zero_variance_group_mask(self):
        rewards = np.array([[1, 1, 1], [0, 1, 0], [0.5, 0.5, 0.5]], np.float32)
        out = self.variant(core.zero_variance_group_mask)(rewards)
        np.testing.assert_array_equal(out, [[0, 0, 0], [1, 1, 1], [0, 0, 0]])

    @chex.variants(**VARIANTS)
    def test_overlong_penalty(self):
        lengths = np.array([10, 16, 17, 18, 20, 25])
        out = self.variant(lambda l: core.overlong_penalty(l, max_length=20, buffer=4, factor=1.0))(lengths)
        np.testing.assert_allclose(out, [0, 0, -0.25, -0.5, -1.0, -1.0], atol=1e-7)
        out = self.variant(lambda l: core.overlong_penalty(l, max_length=20, buffer=4, factor=0.5))(lengths)
        np.testing.assert_allclose(out, [0, 0, -0.125, -0.25, -0.5, -0.5], atol=1e-7)

    @chex.variants(**VARIANTS)
    def test_mask_truncated_and_group_expansion(self):
        mask = lengths_to_mask([2, 3, 1, 0], 3)
        out = self.variant(core.mask_truncated)(mask, np.array([False, True, False, True]))
        np.testing.assert_array_equal(out, lengths_to_mask([2, 0, 1, 0], 3))
        keep = np.array([[1.0, 1.0], [0.0, 0.0]], np.float32)
        out = self.variant(core.expand_group_mask)(keep, mask)
        np.testing.assert_array_equal(out, lengths_to_mask([2, 3, 0, 0], 3))


def test_bad_arguments():
    with pytest.raises(ValueError, match="buffer"):
        core.overlong_penalty(np.array([1]), max_length=4, buffer=8)
    with pytest.raises(ValueError, match=r"\(3,\).*\(4, 3\)"):
        core.mask_truncated(np.ones((4, 3)), np.zeros(3, bool))
    with pytest.raises(ValueError, match=r"\(2, 2\).*\(3, 1\)"):
        core.expand_group_mask(np.ones((2, 2)), np.ones((3, 1)))
