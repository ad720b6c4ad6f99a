"""DPPO: a trust region on an estimate of the policy divergence instead of PPO's ratio clip
(docs/objectives.md#dppo-divergence-based-trust-region).

Both losses have the common policy-loss signature of core/losses.py. PPO stops a token's
gradient when its ratio rho = pi / pi_old leaves [1 - eps, 1 + eps], a bound that is loose for
likely tokens (a large change of probability mass) and tight for unlikely ones (a tiny one).
DPPO instead masks a token whose update would push an estimate of the divergence between
pi(. | s_t) and pi_old(. | s_t) beyond a threshold delta. The divergence is estimated on the
"binary" distribution {sampled token, everything else}, p = pi(y_t), p_old = pi_old(y_t):

  TV:  D_TV = |p - p_old|
  KL:  D_KL = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))

Only updates that move AWAY from pi_old are masked: with A > 0 (p is pushed up) a token
is masked when p > p_old and D > delta_high, with A < 0 when p < p_old and D > delta_low. A
kept token gets the truncated-IS policy gradient

  l_it = -sg(min(rho_it, C)) A_it log pi_it * keep_it

delta_low = delta_high = delta is the paper's symmetric trust region; separate radii per
direction (like PPO's eps_low / eps_high, DAPO's clip-higher) are the same mechanism with two
numbers: `threshold` sets both, `threshold_low` / `threshold_high` replace one.

Source: Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning"
(arXiv 2602.04879), the Binary-TV and Binary-KL variants; delta = 0.15 (TV) and 0.05 (KL)
as in the authors' verl scripts. C = 20 is our default: verl's effective DPPO clip_ratio_c is
3.0 (its config default; the 20 in its code is a fallback that never applies, verl 1dda039).
The trust region is anchored on pi_old (the learner's recompute), like every other loss here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.losses import PolicyLossOutput, _output, _token_inputs

sg = jax.lax.stop_gradient
_BINARY_EPS = 1e-8  # keeps log(1 - p) finite at p = 1


def binary_tv(p: jax.Array, p_old: jax.Array) -> jax.Array:
    """Total variation between the binary distributions (p, 1 - p) and (p_old, 1 - p_old)."""
    return jnp.abs(p - p_old)


def binary_kl(p: jax.Array, p_old: jax.Array) -> jax.Array:
    """KL(Bernoulli(p_old) || Bernoulli(p)) = p_old log(p_old/p) + (1-p_old) log((1-p_old)/(1-p))."""
    p_old = jnp.clip(p_old, _BINARY_EPS, 1.0)
    p = jnp.clip(p, _BINARY_EPS, 1.0)
    return p_old * (jnp.log(p_old) - jnp.log(p)) + (1.0 - p_old) * (
        jnp.log(1.0 - p_old + _BINARY_EPS) - jnp.log(1.0 - p + _BINARY_EPS))


def _dppo(divergence, logp, old_logp, advantages, mask, sampler_logp, threshold, threshold_low, threshold_high,
          cap, log_ratio_clamp) -> PolicyLossOutput:
    low = threshold if threshold_low is None else threshold_low
    high = threshold if threshold_high is None else threshold_high
    for name, value in (("threshold_low", low), ("threshold_high", high), ("cap", cap)):
        _checks.check_positive(name, value)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    p, p_old = jnp.exp(sg(x.logp)), jnp.exp(x.old_logp)
    divergence_value = divergence(p, p_old)
    up = x.advantages > 0  # the update pushes p up: the upper radius; else the lower one
    masked = jnp.where(up, (p > p_old) & (divergence_value > high), (p < p_old) & (divergence_value > low))
    ratio = jnp.exp(jnp.clip(sg(x.logp) - x.old_logp, -log_ratio_clamp, log_ratio_clamp))
    weight = jnp.minimum(ratio, cap) * (~masked)
    return _output(-weight * x.advantages * x.logp, masked, x.valid)


def dppo_tv_loss(logp, old_logp, advantages, mask, *, sampler_logp=None, threshold: float = 0.15,
                 threshold_low: float | None = None, threshold_high: float | None = None,
                 cap: float = 20.0, log_ratio_clamp: float = 20.0) -> PolicyLossOutput:
    """DPPO-Binary-TV (module doc): tokens whose update leaves |p - p_old| <= threshold are masked.

    Args:
      threshold: delta, the TV trust-region radius (0.15 in the paper's runs).
      threshold_low, threshold_high: the radius for updates that lower / raise p (A < 0 / A > 0);
        None: `threshold`.
      cap: C, the truncation of the detached IS weight rho.
    Returns:
      PolicyLossOutput; clipped marks the masked tokens (their gradient is 0).
    """
    return _dppo(binary_tv, logp, old_logp, advantages, mask, sampler_logp, threshold, threshold_low,
                 threshold_high, cap, log_ratio_clamp)


def dppo_kl_loss(logp, old_logp, advantages, mask, *, sampler_logp=None, threshold: float = 0.05,
                 threshold_low: float | None = None, threshold_high: float | None = None,
                 cap: float = 20.0, log_ratio_clamp: float = 20.0) -> PolicyLossOutput:
    """DPPO-Binary-KL (module doc): tokens whose update leaves binary KL <= threshold are masked.

    Args:
      threshold: delta, the KL trust-region radius (0.05 in the paper's runs).
      threshold_low, threshold_high: the radius for updates that lower / raise p (A < 0 / A > 0);
        None: `threshold`.
      cap: C, the truncation of the detached IS weight rho.
    Returns:
      PolicyLossOutput; clipped marks the masked tokens (their gradient is 0).
    """
    return _dppo(binary_kl, logp, old_logp, advantages, mask, sampler_logp, threshold, threshold_low,
                 threshold_high, cap, log_ratio_clamp)


POLICY_LOSSES = {"dppo_tv": dppo_tv_loss, "dppo_kl": dppo_kl_loss}
