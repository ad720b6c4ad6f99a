"""KL estimators: hand values, gradients, expm1 precision, masking."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core

VARIANTS = dict(with_jit=True, without_jit=True)


class KlTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_hand_values_and_gradients(self):
        logp = np.array([[-1.0, -0.5]], np.float32)
        ref = np.array([[-2.0, -0.5]], np.float32)  # x = ref - logp = (-1, 0)
        expected = {"k1": [1.0, 0.0], "k2": [0.5, 0.0], "k3": [np.exp(-1.0), 0.0]}
        # d/d logp with dx/d logp = -1: k1 -> 1, k2 -> -x, k3 -> 1 - e^x
        expected_grad = {"k1": [1.0, 1.0], "k2": [1.0, 0.0], "k3": [1 - np.exp(-1.0), 0.0]}
        for name, fn in core.KL_ESTIMATORS.items():
            np.testing.assert_allclose(self.variant(fn)(logp, ref), [expected[name]], rtol=1e-6, err_msg=name)
            grad_logp, grad_ref = jax.grad(lambda a, b: jnp.sum(fn(a, b)), argnums=(0, 1))(logp, ref)
            np.testing.assert_allclose(grad_logp, [expected_grad[name]], rtol=1e-6, err_msg=name)
            np.testing.assert_array_equal(grad_ref, 0.0)

    @chex.variants(**VARIANTS)
    def test_clamp(self):
        out = self.variant(lambda a, b: core.kl_k1(a, b, clamp=20.0))(
            np.zeros((1, 1), np.float32), np.full((1, 1), -100.0, np.float32))
        np.testing.assert_allclose(out, [[20.0]])

    @chex.variants(**VARIANTS)
    def test_k3_is_accurate_and_non_negative_for_tiny_ratios(self):
        x = np.array([[1e-4, -1e-4, 3e-6, -3e-6]], np.float32)
        out = self.variant(core.kl_k3)(np.zeros_like(x), x)
        x64 = x.astype(np.float64)
        reference = x64 ** 2 / 2 + x64 ** 3 / 6 + x64 ** 4 / 24  # Taylor series of e^x - 1 - x
        # expm1 leaves only the rounding of x itself: |error| <= 2 float32 ulps of |x|.
        bound = 2 * np.finfo(np.float32).eps * np.abs(x64)
        assert np.all(np.abs(np.asarray(out, np.float64) - reference) <= bound)
        assert np.all(np.asarray(out) >= 0)
        naive = np.exp(x) - np.float32(1.0) - x  # float32 without expm1
        assert np.max(np.abs(naive - reference) / bound) > 100


def test_mask_zeroes_nan_positions_and_their_gradient():
    logp = np.array([[-1.0, np.nan]], np.float32)
    ref = np.array([[-2.0, np.inf]], np.float32)
    mask = np.array([[1.0, 0.0]], np.float32)
    for fn in core.KL_ESTIMATORS.values():
        value, grad = jax.value_and_grad(lambda a: jnp.sum(fn(a, ref, mask=mask)))(logp)
        assert np.isfinite(value)
        assert grad[0, 1] == 0.0 and np.isfinite(grad[0, 0])


def test_unknown_estimator_lists_names():
    with pytest.raises(ValueError, match="'k4'.*k1, k2, k3"):
        core.get_kl_estimator("k4")


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"\(1, 2\).*\(1, 3\)"):
        core.kl_k3(np.zeros((1, 2), np.float32), np.zeros((1, 3), np.float32))
