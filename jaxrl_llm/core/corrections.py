"""Training-inference mismatch corrections and metrics (docs/objectives.md#mismatch-corrections).

The sampler mu (e.g. vLLM) and the learner pi_old compute slightly different
probabilities for the same tokens, mostly from low precision (Qi et al. 2025).
The corrections re-weight or reject tokens / sequences by

  lr_it = log pi_old_it - log mu_it      (token log-ratio, only valid tokens)
  LR_i = sum_t m_it lr_it                (sequence log-ratio, rho_i = exp(LR_i))

All outputs are detached (stop_gradient inside) and 0 on invalid tokens.
Ratios are capped / compared in log space so nothing overflows.

Building blocks return arrays; the `token_tis`, `token_mis`, `sequence_tis`,
`sequence_mis` and `geometric_sequence_rejection` functions package them as a
CorrectionOutput(weights, keep, clipped, masked) with one common signature

    correction(old_logp, sampler_logp, mask, **hyper) -> CorrectionOutput

which is what a recipe binds: weights multiply the per-token policy loss,
keep removes rejected tokens from the loss AND from the aggregation
denominators (recompute token_weights on mask * keep); masked marks every token whose
weight was set to 0 (for the masked-fraction metric). NeMo-RL's seq-mask-tis and AReaL's
decoupled PPO are in core/off_policy.py.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks

sg = jax.lax.stop_gradient


class CorrectionOutput(NamedTuple):
    weights: jax.Array  # [N, T] float32 multiplicative IS weight, 0 where not kept
    keep: jax.Array  # [N, T] float32 1 = token stays in the loss and denominators
    clipped: jax.Array  # [N, T] float32 1 = weight was truncated (TIS) at this token
    masked: jax.Array  # [N, T] float32 1 = the token's weight was set to 0 (rejected), whether or not it
    #                    stays in the denominators (decoupled PPO keeps it there, as AReaL does)


def log_bound(value):
    """log of a hyperparameter; a Python float when concrete (weakly typed in jnp ops)."""
    return float(np.log(value)) if _checks.is_concrete(value) else jnp.log(value)


def token_log_ratio(old_logp, sampler_logp, mask) -> tuple[jax.Array, jax.Array]:
    """(lr [N, T] = log pi_old - log mu on valid tokens (0 elsewhere), valid [N, T] bool)."""
    _checks.check_float(old_logp, 2)
    _checks.check_float(sampler_logp, 2)
    _checks.check_same_shape(old_logp=old_logp, sampler_logp=sampler_logp, mask=mask)
    valid = _checks.valid_tokens(mask)
    old_logp = _checks.masked_zero(sg(_checks.to_float32(old_logp)), valid)
    sampler_logp = _checks.masked_zero(sg(_checks.to_float32(sampler_logp)), valid)
    return old_logp - sampler_logp, valid


def sequence_log_ratio(old_logp, sampler_logp, mask) -> jax.Array:
    """[N] LR_i = sum_t m_it (log pi_old_it - log mu_it) = log rho_i."""
    log_ratio, _ = token_log_ratio(old_logp, sampler_logp, mask)
    return jnp.sum(log_ratio, axis=1)


def token_tis_weights(old_logp, sampler_logp, mask, *, cap: float = 2.0) -> jax.Array:
    """Truncated importance sampling per token.

    w_it = min(pi_old_it / mu_it, C) m_it

    Source: Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You
    Off-Policy RL Training" (fengyao.notion.site), C = 2.

    Returns:
      [N, T] float32, detached.
    """
    _checks.check_positive("cap", cap)
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    return jnp.where(valid, jnp.exp(jnp.minimum(log_ratio, log_bound(cap))), 0.0)


def token_mis_mask(old_logp, sampler_logp, mask, *, low: float = 0.5, high: float = 5.0) -> jax.Array:
    """Masked importance sampling per token: keep only ratios inside [low, high].

    keep_it = m_it [low <= pi_old_it / mu_it <= high]

    Source: IcePop (Ling Team 2025, "Every Step Evolves: Scaling RL for
    Trillion-Scale Thinking Model", arXiv 2510.18855), [0.5, 5]; verl
    rollout_is "mask" mode.

    Returns:
      [N, T] float32 in {0, 1}.
    """
    check_bounds(low, high)
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    inside = (log_ratio >= log_bound(low)) & (log_ratio <= log_bound(high))
    return (valid & inside).astype(jnp.float32)


def sequence_tis_weights(old_logp, sampler_logp, mask, *, cap: float = 2.0) -> jax.Array:
    """Truncated importance sampling per sequence, broadcast to its tokens.

    w_it = min(rho_i, C) m_it,  rho_i = exp(sum_t m_it (log pi_old_it - log mu_it))

    Source: Qi et al. 2025, Precision-RL (arXiv 2510.26788).

    Returns:
      [N, T] float32, detached.
    """
    _checks.check_positive("cap", cap)
    log_rho = sequence_log_ratio(old_logp, sampler_logp, mask)
    valid = _checks.valid_tokens(mask)
    return jnp.where(valid, jnp.exp(jnp.minimum(log_rho, log_bound(cap)))[:, None], 0.0)


def sequence_mis_mask(old_logp, sampler_logp, mask, *, cap: float = 10.0) -> jax.Array:
    """Masked importance sampling per sequence: reject sequences with rho_i > C.

    keep_it = m_it [rho_i <= C]

    Source: Qi et al. 2025, Precision-RL (arXiv 2510.26788); default C = 10.

    Returns:
      [N, T] float32 in {0, 1}.
    """
    _checks.check_positive("cap", cap)
    log_rho = sequence_log_ratio(old_logp, sampler_logp, mask)
    valid = _checks.valid_tokens(mask)
    return (valid & (log_rho <= log_bound(cap))[:, None]).astype(jnp.float32)


def geometric_sequence_mask(old_logp, sampler_logp, mask, *, low: float, high: float) -> jax.Array:
    """Rejects sequences whose geometric-mean ratio leaves [low, high].

    g_i = exp((1/L_i) sum_t m_it (log pi_old_it - log mu_it));
    keep_it = m_it [low <= g_i <= high]

    Source: DeepSeek-V3.2 (2025) off-policy sequence masking; verl's
    geometric rejection sampling ("Geo-RS"). The bounds are tight (e.g.
    [0.999, 1.001]) and setting-specific, so they have no default.

    Returns:
      [N, T] float32 in {0, 1}.
    """
    check_bounds(low, high)
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    lengths = jnp.sum(valid, axis=1)
    mean_log_ratio = jnp.sum(log_ratio, axis=1) / jnp.maximum(lengths, 1)
    inside = (mean_log_ratio >= log_bound(low)) & (mean_log_ratio <= log_bound(high))
    return (valid & inside[:, None]).astype(jnp.float32)


def check_bounds(low, high) -> None:
    """Refuses a non-positive bound or low > high (when concrete)."""
    _checks.check_positive("low", low)
    _checks.check_positive("high", high)
    if _checks.all_concrete(low, high) and not float(low) <= float(high):
        raise ValueError(f"need low <= high, got low={low}, high={high}")


# Corrections with the common signature, as bound by recipes.


def token_tis(old_logp, sampler_logp, mask, *, cap: float = 2.0) -> CorrectionOutput:
    """Token TIS: weights min(pi_old/mu, C), nothing rejected (see token_tis_weights)."""
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    weights = token_tis_weights(old_logp, sampler_logp, mask, cap=cap)
    clipped = valid & (log_ratio > log_bound(cap))
    return CorrectionOutput(weights, valid.astype(jnp.float32), clipped.astype(jnp.float32), jnp.zeros_like(weights))


def token_mis(old_logp, sampler_logp, mask, *, low: float = 0.5, high: float = 5.0) -> CorrectionOutput:
    """Token MIS (IcePop): weight pi_old/mu inside [low, high], token rejected outside."""
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    keep = token_mis_mask(old_logp, sampler_logp, mask, low=low, high=high)
    weights = keep * jnp.exp(jnp.minimum(log_ratio, log_bound(high)))
    return CorrectionOutput(weights, keep, jnp.zeros_like(keep), rejected(keep, valid))


def sequence_tis(old_logp, sampler_logp, mask, *, cap: float = 2.0) -> CorrectionOutput:
    """Sequence TIS: weights min(rho_i, C) on every token of i, nothing rejected."""
    valid = _checks.valid_tokens(mask)
    log_rho = sequence_log_ratio(old_logp, sampler_logp, mask)
    weights = sequence_tis_weights(old_logp, sampler_logp, mask, cap=cap)
    clipped = valid & (log_rho > log_bound(cap))[:, None]
    return CorrectionOutput(weights, valid.astype(jnp.float32), clipped.astype(jnp.float32), jnp.zeros_like(weights))


def sequence_mis(old_logp, sampler_logp, mask, *, cap: float = 10.0) -> CorrectionOutput:
    """Sequence MIS (Precision-RL): weight rho_i if rho_i <= C, else sequence rejected."""
    log_rho = sequence_log_ratio(old_logp, sampler_logp, mask)
    keep = sequence_mis_mask(old_logp, sampler_logp, mask, cap=cap)
    weights = keep * jnp.exp(jnp.minimum(log_rho, log_bound(cap)))[:, None]
    return CorrectionOutput(weights, keep, jnp.zeros_like(keep), rejected(keep, _checks.valid_tokens(mask)))


def geometric_sequence_rejection(
    old_logp, sampler_logp, mask, *, low: float, high: float
) -> CorrectionOutput:
    """Geometric sequence mask as a correction: weight 1, rejected outside [low, high]."""
    keep = geometric_sequence_mask(old_logp, sampler_logp, mask, low=low, high=high)
    return CorrectionOutput(keep, keep, jnp.zeros_like(keep), rejected(keep, _checks.valid_tokens(mask)))


def rejected(keep, valid) -> jax.Array:
    """float32 [N, T], 1 on the valid tokens that `keep` rejects."""
    return (valid & (keep == 0)).astype(jnp.float32)


def mismatch_metrics(old_logp, sampler_logp, mask) -> dict[str, jax.Array]:
    """Training-inference mismatch diagnostics (docs/objectives.md#mismatch-metrics), float32 scalars.

    With d_it = log mu_it - log pi_old_it over valid tokens (tokens sampled from mu):
      mismatch_k1 = sum m d / sum m                   (estimates KL(mu || pi_old))
      mismatch_k2 = sum m d^2 / (2 sum m)
      mismatch_k3 = sum m (expm1(-d) + d) / sum m     (d clamped to +-20)
      mismatch_tokens_differing = sum m [log mu != log pi_old]  (a count; 0 when sampling is batch-invariant)
      mismatch_prob_diff_max / _min = max / min of mu_t - pi_old_t in probability
      mismatch_prob_pearson = Pearson correlation of (mu_t, pi_old_t) probabilities
        (0 when either has zero variance)
      mismatch_seq_ess = (sum_i w_i)^2 / (N sum_i w_i^2), w_i = rho_i
        (scale-free, so computed as exp(LR_i - max LR)); 1 = no mismatch
      mismatch_token_ess = (sum_it m w_it)^2 / (n sum_it m w_it^2), w_it = pi_old_it / mu_it over
        the n valid tokens: the same normalised ESS per token (Kong 1992's ESS / n)
      mismatch_seq_log_ratio_length_slope = least-squares slope of LR_i on L_i
        (Qi et al. 2025 report -1.01 for BF16 vs -0.07 for FP16; 0 if all L_i equal)
      mismatch_seq_log_ratio_mean = mean_i LR_i
    N counts responses with at least one valid token. Source: Yao et al. 2025;
    Qi et al. 2025 (arXiv 2510.26788); verl rollout_corr metrics.
    """
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    diff = -log_ratio  # log mu - log pi_old
    count = jnp.maximum(jnp.sum(valid), 1)
    k1 = jnp.sum(diff) / count
    k2 = 0.5 * jnp.sum(jnp.square(diff)) / count
    x = jnp.clip(log_ratio, -20.0, 20.0)
    k3 = jnp.sum(jnp.where(valid, jnp.expm1(x) - x, 0.0)) / count

    old_prob, sampler_prob = _token_probs(old_logp, sampler_logp, valid)
    prob_diff = sampler_prob - old_prob
    any_valid = jnp.any(valid)
    diff_max = jnp.where(any_valid, jnp.max(jnp.where(valid, prob_diff, -jnp.inf)), 0.0)
    diff_min = jnp.where(any_valid, jnp.min(jnp.where(valid, prob_diff, jnp.inf)), 0.0)

    lengths = jnp.sum(valid, axis=1).astype(jnp.float32)
    rows = lengths > 0
    seq_log_ratio = jnp.sum(log_ratio, axis=1)
    return {
        "mismatch_k1": k1,
        "mismatch_k2": k2,
        "mismatch_k3": k3,
        "mismatch_tokens_differing": jnp.sum(valid & (log_ratio != 0)).astype(jnp.float32),
        "mismatch_prob_diff_max": diff_max,
        "mismatch_prob_diff_min": diff_min,
        "mismatch_prob_pearson": _pearson(sampler_prob, old_prob, valid),
        "mismatch_seq_ess": _effective_sample_size(seq_log_ratio, rows),
        "mismatch_token_ess": _effective_sample_size(log_ratio, valid),
        "mismatch_seq_log_ratio_length_slope": _slope(lengths, seq_log_ratio, rows),
        "mismatch_seq_log_ratio_mean": jnp.sum(jnp.where(rows, seq_log_ratio, 0.0))
        / jnp.maximum(jnp.sum(rows), 1),
    }


def _token_probs(old_logp, sampler_logp, valid):
    old = _checks.masked_zero(sg(_checks.to_float32(old_logp)), valid)
    sampler = _checks.masked_zero(sg(_checks.to_float32(sampler_logp)), valid)
    return jnp.exp(old), jnp.exp(sampler)


def _safe_ratio(numerator, denominator) -> jax.Array:
    """numerator / denominator, 0 where the denominator is not positive."""
    positive = denominator > 0
    return jnp.where(positive, numerator / jnp.where(positive, denominator, 1.0), 0.0)


def _centred(x, selected) -> jax.Array:
    mean = jnp.sum(jnp.where(selected, x, 0.0)) / jnp.maximum(jnp.sum(selected), 1)
    return jnp.where(selected, x - mean, 0.0)


def _pearson(x, y, selected) -> jax.Array:
    x_c, y_c = _centred(x, selected), _centred(y, selected)
    return _safe_ratio(jnp.sum(x_c * y_c), jnp.sqrt(jnp.sum(x_c * x_c) * jnp.sum(y_c * y_c)))


def _effective_sample_size(log_weights, selected) -> jax.Array:
    # (sum w)^2 / (N sum w^2) does not change when every w is scaled, so shift
    # the logs by their max first: no overflow whatever the sequence lengths.
    shift = jnp.where(jnp.any(selected), jnp.max(jnp.where(selected, log_weights, -jnp.inf)), 0.0)
    weights = jnp.where(selected, jnp.exp(log_weights - shift), 0.0)
    count = jnp.maximum(jnp.sum(selected), 1)
    return _safe_ratio(jnp.square(jnp.sum(weights)), count * jnp.sum(jnp.square(weights)))


def _slope(x, y, selected) -> jax.Array:
    x_c, y_c = _centred(x, selected), _centred(y, selected)
    return _safe_ratio(jnp.sum(x_c * y_c), jnp.sum(x_c * x_c))


CORRECTIONS = {
    "token_tis": token_tis,
    "token_mis": token_mis,
    "sequence_tis": sequence_tis,
    "sequence_mis": sequence_mis,
    "geometric_sequence_rejection": geometric_sequence_rejection,
}
