"""Clip-Cov and KL-Cov: entropy control through the tokens with the largest covariance between
log-probability and advantage (docs/objectives.md#clip-cov-and-kl-cov).

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models" (arXiv 2505.22617), show that the change of the policy's entropy in a policy-gradient
step is driven by Cov(log pi(y), A(y)): tokens that are both likely and advantaged lower the
entropy most. Both methods act on a small fraction of such tokens, picked by the centred product

  c_it = (A_it - mean(A)) (log pi_old_it - mean(log pi_old)),   means over the batch's valid tokens

  Clip-Cov: of the tokens with lower < c_it < upper, the top r share (at least one token) loses
            its gradient; the rest get the PPO clip loss.
  KL-Cov:   the top r share by c_it gets the penalty kl_coef |log pi - log pi_old| on top of
            the unclipped surrogate -rho A; the rest get -rho A alone.

The selection must not depend on how the step is cut into micro-batches, so it is made ONCE on
the whole step batch with pi_old (`top_covariance_tokens`, called by `prepare_step_batch`
through `Recipe.token_selection`) and reaches the loss as the per-token 0/1 array `selected`.
The paper draws Clip-Cov's tokens at random within the band; we take the band's top-covariance
tokens, a deterministic choice (an exact resume needs no random state). Defaults: r = 2e-4 and
band (1, 5) as verl's; kl_coef = 1 as the paper's scripts (verl's config default ppo_kl_coef is 0.1).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.losses import PolicyLossOutput, _check_clip_range, _output, _pessimistic_clip, _token_inputs

sg = jax.lax.stop_gradient


def covariance_scores(advantages, logp, mask) -> jax.Array:
    """[N, T] c_it = (A_it - mean A)(log pi_it - mean log pi), means over the valid tokens; 0 elsewhere."""
    valid = _checks.valid_tokens(mask)
    adv = _checks.masked_zero(sg(_checks.to_float32(advantages)), valid)
    lp = _checks.masked_zero(sg(_checks.to_float32(logp)), valid)
    count = jnp.maximum(jnp.sum(valid), 1)
    centred = (adv - jnp.sum(adv) / count) * (lp - jnp.sum(lp) / count)
    return jnp.where(valid, centred, 0.0)


def top_covariance_tokens(advantages, old_logp, mask, *, fraction: float, lower: float | None = None,
                          upper: float | None = None) -> jax.Array:
    """float32 [N, T], 1 on the selected tokens: among the valid tokens with lower < c_it < upper
    (None: unbounded), the max(1, floor(fraction * #valid)) with the largest c_it; ties go to the
    earlier token in row-major order.

    Call it on the WHOLE step batch (means, count and ranks are over it).
    """
    if _checks.is_concrete(fraction) and not 0.0 < float(fraction) <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    valid = _checks.valid_tokens(mask)
    scores = covariance_scores(advantages, old_logp, mask)
    candidate = valid
    if lower is not None:
        candidate = candidate & (scores > lower)
    if upper is not None:
        candidate = candidate & (scores < upper)
    count = jnp.maximum(jnp.floor(fraction * jnp.sum(valid)), 1.0)
    flat = jnp.where(candidate, scores, -jnp.inf).ravel()
    order = jnp.argsort(-flat, stable=True)
    rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return (candidate & (rank.reshape(valid.shape) < count)).astype(jnp.float32)


def _selected(selected, x) -> jax.Array:
    if selected is None:
        raise ValueError("this loss needs `selected`, the tokens picked on the whole step batch: a Recipe with "
                         "token_selection computes them in prepare_step_batch (core.entropy_control)")
    _checks.check_same_shape(logp=x.logp, selected=selected)
    return jnp.where(x.valid, sg(_checks.to_float32(selected)), 0.0) > 0


def clip_cov_loss(logp, old_logp, advantages, mask, *, sampler_logp=None, selected=None, eps_low: float = 0.2,
                  eps_high: float = 0.2, log_ratio_clamp: float = 20.0) -> PolicyLossOutput:
    """Clip-Cov (module doc): the PPO clip loss, 0 (no gradient) on the `selected` tokens.

    l_it = (1 - s_it) max(-rho A, -clip(rho, 1 - eps_low, 1 + eps_high) A)

    Args:
      selected: [N, T] 0/1, from `top_covariance_tokens` on the whole step batch.
      eps_low, eps_high: PPO's clip range.
    Returns:
      PolicyLossOutput; clipped marks the PPO-clipped and the selected tokens.
    """
    _check_clip_range(eps_low, eps_high)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    chosen = _selected(selected, x)
    ratio = jnp.exp(jnp.clip(x.logp - x.old_logp, -log_ratio_clamp, log_ratio_clamp))
    loss, clip_binds = _pessimistic_clip(ratio, x.advantages, eps_low, eps_high)
    return _output(jnp.where(chosen, 0.0, loss), clip_binds | chosen, x.valid)


def kl_cov_loss(logp, old_logp, advantages, mask, *, sampler_logp=None, selected=None, kl_coef: float = 1.0,
                log_ratio_clamp: float = 20.0) -> PolicyLossOutput:
    """KL-Cov (module doc): the unclipped surrogate plus a |log-ratio| penalty on the `selected` tokens.

    l_it = -rho_it A_it + kl_coef s_it |log pi_it - log pi_old_it|

    Args:
      selected: [N, T] 0/1, from `top_covariance_tokens` on the whole step batch.
      kl_coef: beta, the penalty's weight (1 in the paper).
    Returns:
      PolicyLossOutput; clipped marks the selected (penalised) tokens.
    """
    _checks.check_positive("kl_coef", kl_coef, allow_zero=True)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    chosen = _selected(selected, x)
    log_ratio = jnp.clip(x.logp - x.old_logp, -log_ratio_clamp, log_ratio_clamp)
    # |x| as x sign(sg(x)): its gradient at x = 0 (the first on-policy pass) is 0, not jnp.abs's 1
    penalty = jnp.where(chosen, kl_coef * log_ratio * jnp.sign(sg(log_ratio)), 0.0)
    return _output(-jnp.exp(log_ratio) * x.advantages + penalty, chosen, x.valid)


POLICY_LOSSES = {"clip_cov": clip_cov_loss, "kl_cov": kl_cov_loss}

# The token selection each loss needs (Recipe.token_selection), with the paper's defaults.
SELECTIONS = {
    clip_cov_loss: functools.partial(top_covariance_tokens, fraction=2e-4, lower=1.0, upper=5.0),
    kl_cov_loss: functools.partial(top_covariance_tokens, fraction=2e-4),
}
