"""Mismatch corrections against hand values; metrics against numpy formulas."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import random_batch

VARIANTS = dict(with_jit=True, without_jit=True)


def _logps_with_ratios(ratios, mask=None):
    """(old_logp, sampler_logp) with pi_old / mu = ratios, NaN where mask == 0."""
    ratios = np.asarray(ratios, np.float64)
    old = np.full(ratios.shape, -1.0)
    mu = old - np.log(ratios)
    if mask is not None:
        old = np.where(mask != 0, old, np.nan)
        mu = np.where(mask != 0, mu, np.nan)
    return old.astype(np.float32), mu.astype(np.float32)


class TokenCorrectionsTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_token_tis(self):
        mask = np.array([[1, 1, 1, 0]], np.float32)
        old, mu = _logps_with_ratios([[3.0, 1.0, 0.5, 1.0]], mask)
        out = self.variant(lambda a, b, m: core.token_tis(a, b, m, cap=2.0))(old, mu, mask)
        np.testing.assert_allclose(out.weights, [[2.0, 1.0, 0.5, 0.0]], rtol=1e-5)
        np.testing.assert_array_equal(out.keep, [[1, 1, 1, 0]])
        np.testing.assert_array_equal(out.clipped, [[1, 0, 0, 0]])

    @chex.variants(**VARIANTS)
    def test_token_mis(self):
        mask = np.ones((1, 4), np.float32)
        old, mu = _logps_with_ratios([[0.25, 1.0, 6.0, 4.0]])
        out = self.variant(lambda a, b, m: core.token_mis(a, b, m, low=0.5, high=5.0))(old, mu, mask)
        np.testing.assert_array_equal(out.keep, [[0, 1, 0, 1]])
        np.testing.assert_allclose(out.weights, [[0.0, 1.0, 0.0, 4.0]], rtol=1e-5)
        keep = core.token_mis_mask(old, mu, mask, low=0.5, high=5.0)
        np.testing.assert_array_equal(keep, out.keep)


class SequenceCorrectionsTest(chex.TestCase):
    # rows: rho = 3 * 1 = 3, 0.5 * 1 = 0.5, 4 * 5 = 20, padding-only row
    ratios = [[3.0, 1.0], [0.5, 1.0], [4.0, 5.0], [1.0, 1.0]]
    mask = np.array([[1, 1], [1, 1], [1, 1], [0, 0]], np.float32)

    @chex.variants(**VARIANTS)
    def test_sequence_tis(self):
        old, mu = _logps_with_ratios(self.ratios, self.mask)
        out = self.variant(lambda a, b, m: core.sequence_tis(a, b, m, cap=2.0))(old, mu, self.mask)
        np.testing.assert_allclose(out.weights, [[2, 2], [0.5, 0.5], [2, 2], [0, 0]], rtol=1e-5)
        np.testing.assert_array_equal(out.clipped, [[1, 1], [0, 0], [1, 1], [0, 0]])
        np.testing.assert_allclose(core.sequence_log_ratio(old, mu, self.mask),
                                   np.log([3.0, 0.5, 20.0, 1.0]), rtol=1e-5, atol=1e-6)

    @chex.variants(**VARIANTS)
    def test_sequence_mis(self):
        old, mu = _logps_with_ratios(self.ratios, self.mask)
        out = self.variant(lambda a, b, m: core.sequence_mis(a, b, m, cap=10.0))(old, mu, self.mask)
        np.testing.assert_array_equal(out.keep, [[1, 1], [1, 1], [0, 0], [0, 0]])
        np.testing.assert_allclose(out.weights, [[3, 3], [0.5, 0.5], [0, 0], [0, 0]], rtol=1e-5)

    @chex.variants(**VARIANTS)
    def test_geometric_sequence_mask(self):
        mask = np.ones((2, 2), np.float32)
        old = np.zeros((2, 2), np.float32)
        mu = -np.array([[0.0004, 0.0006], [0.01, 0.01]], np.float32)  # mean log-ratio 5e-4, 1e-2
        out = self.variant(lambda a, b, m: core.geometric_sequence_mask(a, b, m, low=0.999, high=1.001))(
            old, mu, mask)
        np.testing.assert_array_equal(out, [[1, 1], [0, 0]])
        rejection = core.geometric_sequence_rejection(old, mu, mask, low=0.999, high=1.001)
        np.testing.assert_array_equal(rejection.keep, out)
        np.testing.assert_array_equal(rejection.weights, out)


def test_corrections_are_detached():
    batch = random_batch(0)
    for fn in (core.token_tis, core.token_mis, core.sequence_tis, core.sequence_mis):
        grads = jax.grad(lambda a, b: jnp.sum(fn(a, b, batch.mask).weights), argnums=(0, 1))(
            batch.old_logp, batch.sampler_logp)
        for grad in grads:
            np.testing.assert_array_equal(grad, 0.0)


def test_bad_bounds():
    x = np.zeros((1, 1), np.float32)
    with pytest.raises(ValueError, match="low <= high"):
        core.token_mis_mask(x, x, np.ones((1, 1)), low=2.0, high=1.0)
    with pytest.raises(ValueError, match="cap"):
        core.token_tis_weights(x, x, np.ones((1, 1)), cap=-1.0)


def _numpy_metrics(old, mu, mask):
    valid = mask != 0
    d = (mu - old).astype(np.float64)[valid]
    p_old, p_mu = np.exp(old.astype(np.float64))[valid], np.exp(mu.astype(np.float64))[valid]
    rows = valid.any(1)
    seq = np.array([np.sum((old - mu).astype(np.float64)[i][valid[i]]) for i in range(len(mask))])[rows]
    lengths = valid.sum(1)[rows]
    w, w_token = np.exp(seq), np.exp(-d)
    return {
        "mismatch_k1": d.mean(),
        "mismatch_k2": (d ** 2).mean() / 2,
        "mismatch_k3": np.mean(np.exp(-d) - 1 + d),
        "mismatch_tokens_differing": np.sum(mu[valid] != old[valid]),
        "mismatch_prob_diff_max": np.max(p_mu - p_old),
        "mismatch_prob_diff_min": np.min(p_mu - p_old),
        "mismatch_prob_pearson": np.corrcoef(p_mu, p_old)[0, 1],
        "mismatch_seq_ess": w.sum() ** 2 / (len(w) * np.sum(w ** 2)),
        "mismatch_token_ess": w_token.sum() ** 2 / (len(w_token) * np.sum(w_token ** 2)),
        "mismatch_seq_log_ratio_length_slope": np.polyfit(lengths, seq, 1)[0],
        "mismatch_seq_log_ratio_mean": seq.mean(),
    }


class MismatchMetricsTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_matches_numpy(self):
        batch = random_batch(2, width=12, lengths=np.r_[0, np.arange(1, 16)] % 13)
        old = np.where(batch.mask != 0, batch.old_logp, np.nan).astype(np.float32)
        out = self.variant(core.mismatch_metrics)(old, batch.sampler_logp, batch.mask)
        expected = _numpy_metrics(batch.old_logp, batch.sampler_logp, batch.mask)
        assert set(out) == set(expected)
        for key, value in expected.items():
            np.testing.assert_allclose(out[key], value, rtol=1e-4, atol=1e-6, err_msg=key)

    @chex.variants(**VARIANTS)
    def test_no_mismatch(self):
        batch = random_batch(3)
        out = self.variant(core.mismatch_metrics)(batch.old_logp, batch.old_logp, batch.mask)
        for key in ("mismatch_k1", "mismatch_k2", "mismatch_k3", "mismatch_prob_diff_max",
                    "mismatch_prob_diff_min", "mismatch_seq_log_ratio_length_slope", "mismatch_tokens_differing"):
            assert float(out[key]) == 0.0, key
        np.testing.assert_allclose(out["mismatch_prob_pearson"], 1.0, rtol=1e-6)
        np.testing.assert_allclose(out["mismatch_seq_ess"], 1.0, rtol=1e-6)

    def test_empty_batch_is_finite(self):
        zeros = np.zeros((2, 3), np.float32)
        out = core.mismatch_metrics(zeros, zeros, zeros)
        assert all(np.isfinite(float(v)) for v in out.values())
