"""Per-token KL estimators to a frozen reference (docs/objectives.md#kl-estimators).

x_it = clip(log pi_ref_it - log pi_it, -clamp, clamp), tokens sampled from pi:
  k1 = -x            unbiased for KL(pi || pi_ref), high variance, can be < 0
  k2 = x^2 / 2       biased, low variance, >= 0
  k3 = (e^x - 1) - x unbiased, >= 0; computed with expm1 so it stays >= 0
                     for tiny x (tunix #2315 went negative without it)
Source: Schulman 2020, "Approximating KL Divergence"
(http://joschu.net/blog/kl-approx.html).

logp is differentiable; ref_logp is a constant (stop_gradient inside). Use
them in the loss as beta * aggregate(k, weights), or fold them into rewards.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks


def _log_ratio(logp, ref_logp, mask, clamp) -> tuple[jax.Array, jax.Array | None]:
    _checks.check_float(logp, 2)
    _checks.check_float(ref_logp, 2)
    _checks.check_same_shape(logp=logp, ref_logp=ref_logp, mask=mask)
    _checks.check_positive("clamp", clamp)
    logp = _checks.to_float32(logp)
    ref_logp = jax.lax.stop_gradient(_checks.to_float32(ref_logp))
    valid = None
    if mask is not None:
        valid = _checks.valid_tokens(mask)
        logp, ref_logp = _checks.masked_zero(logp, valid), _checks.masked_zero(ref_logp, valid)
    return jnp.clip(ref_logp - logp, -clamp, clamp), valid


def _masked(value: jax.Array, valid: jax.Array | None) -> jax.Array:
    return value if valid is None else jnp.where(valid, value, 0.0)


def kl_k1(logp, ref_logp, *, mask=None, clamp: float = 20.0) -> jax.Array:
    """k1 = -x = log pi - log pi_ref per token (x clamped to +-clamp).

    Args:
      logp, ref_logp: [N, T]. mask: optional [N, T]; if given, invalid
        positions are 0 in value and gradient even if the inputs are NaN there.
    Returns:
      [N, T] float32.
    """
    x, valid = _log_ratio(logp, ref_logp, mask, clamp)
    return _masked(-x, valid)


def kl_k2(logp, ref_logp, *, mask=None, clamp: float = 20.0) -> jax.Array:
    """k2 = x^2 / 2 per token, x = log pi_ref - log pi clamped. Shapes as kl_k1."""
    x, valid = _log_ratio(logp, ref_logp, mask, clamp)
    return _masked(0.5 * jnp.square(x), valid)


def kl_k3(logp, ref_logp, *, mask=None, clamp: float = 20.0) -> jax.Array:
    """k3 = expm1(x) - x per token, x = log pi_ref - log pi clamped. Shapes as kl_k1."""
    x, valid = _log_ratio(logp, ref_logp, mask, clamp)
    return _masked(jnp.expm1(x) - x, valid)


KL_ESTIMATORS = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


def get_kl_estimator(name: str):
    """Returns kl_k1 / kl_k2 / kl_k3 by name; ValueError listing valid names otherwise."""
    if name not in KL_ESTIMATORS:
        raise ValueError(f"unknown KL estimator {name!r}; valid names: {', '.join(KL_ESTIMATORS)}")
    return KL_ESTIMATORS[name]
