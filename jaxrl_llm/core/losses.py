"""Per-token policy losses (docs/objectives.md#policy-losses).

Every policy loss has the same call signature

    loss_fn(logp, old_logp, advantages, mask, *, sampler_logp=None, **hyper)
        -> PolicyLossOutput(loss [N, T], clipped [N, T])

so a recipe binds the hyperparameters (functools.partial) and the learner
calls any of them the same way. Conventions:

  * logp: [N, T] log pi of the sampled tokens under the current policy; the
    only differentiable input.
  * old_logp (pi_old, the learner before this update) and sampler_logp (mu,
    the rollout engine) are constants: stop_gradient is applied inside.
  * advantages: [N, T] token-level advantages (see advantages.broadcast_to_tokens).
  * mask: [N, T], non-zero on valid response tokens. Inputs are replaced by 0
    at invalid positions before any arithmetic, so NaN/inf padding gives an
    exactly zero loss and an exactly zero gradient there.
  * loss: per-token loss, 0 where invalid; reduce it with aggregation.aggregate.
  * clipped: float32 1.0 where the objective's clipping / truncation was
    active for that token (for clip-fraction metrics), 0 elsewhere.

rho_it = exp(log pi_it - log pi_old_it). Log-ratios are clamped to
[-log_ratio_clamp, log_ratio_clamp] before exp so a ratio can never overflow
to inf (inf would turn an unselected min/max branch's zero gradient into NaN).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks

sg = jax.lax.stop_gradient


class PolicyLossOutput(NamedTuple):
    loss: jax.Array  # [N, T] per-token loss, 0 on invalid tokens
    clipped: jax.Array  # [N, T] float32 indicator of active clipping


class _TokenInputs(NamedTuple):
    logp: jax.Array
    old_logp: jax.Array
    advantages: jax.Array
    sampler_logp: jax.Array | None
    valid: jax.Array


def _token_inputs(logp, old_logp, advantages, mask, sampler_logp=None) -> _TokenInputs:
    """Checks ranks, dtypes and shapes; float32 compute; zeros at invalid positions."""
    for array in (logp, old_logp, advantages):
        _checks.check_float(array, 2)
    if sampler_logp is not None:
        _checks.check_float(sampler_logp, 2)
    _checks.check_same_shape(
        logp=logp, old_logp=old_logp, advantages=advantages, mask=mask, sampler_logp=sampler_logp
    )
    valid = _checks.valid_tokens(mask)

    def prepared(x, constant):
        x = _checks.to_float32(x)
        return _checks.masked_zero(sg(x) if constant else x, valid)

    return _TokenInputs(
        logp=prepared(logp, constant=False),
        old_logp=prepared(old_logp, constant=True),
        advantages=prepared(advantages, constant=True),
        sampler_logp=None if sampler_logp is None else prepared(sampler_logp, constant=True),
        valid=valid,
    )


def _check_clip_range(eps_low, eps_high) -> None:
    _checks.check_positive("eps_low", eps_low, allow_zero=True)
    _checks.check_positive("eps_high", eps_high, allow_zero=True)


def _sequence_mean(x: jax.Array, valid: jax.Array) -> jax.Array:
    """[N] mean of x over each row's valid tokens; 0 for empty rows."""
    lengths = jnp.sum(valid, axis=1)
    return jnp.sum(jnp.where(valid, x, 0.0), axis=1) / jnp.maximum(lengths, 1)


def _output(loss: jax.Array, clipped: jax.Array, valid: jax.Array) -> PolicyLossOutput:
    return PolicyLossOutput(
        loss=jnp.where(valid, loss, 0.0),
        clipped=jnp.where(valid, clipped, False).astype(jnp.float32),
    )


def _pessimistic_clip(ratio, advantages, eps_low, eps_high):
    """max(-A rho, -A clip(rho, 1-eps_low, 1+eps_high)) and where the clip binds.

    Selected with jnp.where (not jnp.maximum) so that where both branches are
    equal the unclipped branch carries the full gradient.
    """
    unclipped = -advantages * ratio
    clipped = -advantages * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
    clip_binds = clipped > unclipped
    return jnp.where(clip_binds, clipped, unclipped), clip_binds


def pg_loss(logp, old_logp, advantages, mask, *, sampler_logp=None) -> PolicyLossOutput:
    """Vanilla policy gradient (REINFORCE).

    l_it = -A_it log pi_it

    Source: Williams 1992, "Simple statistical gradient-following algorithms
    for connectionist reinforcement learning". old_logp and sampler_logp are
    accepted for the common signature and ignored (on-policy estimator).
    Nothing is ever clipped.
    """
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    return _output(-x.advantages * x.logp, jnp.zeros_like(x.valid), x.valid)


def ppo_clip_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    sampler_logp=None,
    eps_low: float = 0.2,
    eps_high: float = 0.2,
    dual_clip: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """PPO clipped surrogate with asymmetric (clip-higher) and dual clipping.

    l_it = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)
    dual clip (A < 0 only): l_it = min(l_it, -c A)

    Sources: Schulman et al. 2017, "Proximal Policy Optimization Algorithms"
    (arXiv 1707.06347), eps = 0.2; clip-higher eps_high > eps_low from DAPO
    (Yu et al. 2025, arXiv 2503.14476, eps_high = 0.28); dual clip from Ye et
    al. 2020, "Mastering Complex Control in MOBA Games with Deep RL"
    (arXiv 1912.09729), c = 3.

    Args:
      eps_low, eps_high: clip range [1 - eps_low, 1 + eps_high] of rho.
      dual_clip: c > 1 or None (off).
      log_ratio_clamp: |log rho| is clamped to this before exp.
    Returns:
      PolicyLossOutput; clipped marks tokens where the clipped branch or the
      dual clip was selected (their gradient is 0).
    """
    _check_clip_range(eps_low, eps_high)
    if dual_clip is not None and _checks.is_concrete(dual_clip) and not float(dual_clip) > 1.0:
        raise ValueError(f"dual_clip must be > 1 (Ye et al. use 3) or None, got {dual_clip}")
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    ratio = jnp.exp(jnp.clip(x.logp - x.old_logp, -log_ratio_clamp, log_ratio_clamp))
    loss, clipped = _pessimistic_clip(ratio, x.advantages, eps_low, eps_high)
    if dual_clip is not None:
        dual_bound = -dual_clip * x.advantages
        dual_binds = (x.advantages < 0) & (dual_bound < loss)
        loss = jnp.where(dual_binds, dual_bound, loss)
        clipped = clipped | dual_binds
    return _output(loss, clipped, x.valid)


def cispo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    sampler_logp=None,
    eps_high: float,
    eps_low: float | None = None,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """CISPO: REINFORCE weighted by a clipped, detached importance ratio.

    l_it = -sg(clip(rho_it, 1 - eps_low, 1 + eps_high)) A_it log pi_it

    Source: MiniMax 2025, "MiniMax-M1" (arXiv 2506.13585), section 3.1.
    Unlike PPO no token loses its gradient; only its weight is capped. The
    paper sets no lower bound (eps_low large) and tunes only eps_high, whose
    value it does not publish, so eps_high has no default here.

    Args:
      eps_high: upper clip, weight <= 1 + eps_high.
      eps_low: lower clip, weight >= 1 - eps_low; None = no lower bound.
    Returns:
      PolicyLossOutput; clipped marks tokens whose weight was capped.
    """
    _check_clip_range(0.0 if eps_low is None else eps_low, eps_high)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    ratio = jnp.exp(jnp.clip(x.logp - x.old_logp, -log_ratio_clamp, log_ratio_clamp))
    lower = 0.0 if eps_low is None else 1.0 - eps_low
    upper = 1.0 + eps_high
    weight = sg(jnp.clip(ratio, lower, upper))
    clipped = (ratio > upper) | (ratio < lower)
    return _output(-weight * x.advantages * x.logp, clipped, x.valid)


def sapo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    sampler_logp=None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """SAPO: PPO's hard clip replaced by a temperature-controlled sigmoid gate.

    l_it = -f(rho_it) A_it,  f(rho) = 4 / tau * sigmoid(tau (rho - 1)),
    tau = tau_pos where A_it > 0, tau_neg otherwise.

    d l / d log pi = -4 s (1 - s) rho A with s = sigmoid(tau (rho - 1)): at rho = 1 the
    policy gradient itself, decaying smoothly as rho leaves 1 (faster for the larger tau), where
    PPO's clip cuts the gradient to 0 at a fixed band. Source: Gao et al. 2025, "Soft Adaptive
    Policy Optimization" (arXiv 2511.20347); defaults tau_pos = 1.0, tau_neg = 1.05 as verl's.

    Returns:
      PolicyLossOutput; clipped marks tokens whose gate weight 4 s (1 - s) fell below 1/2.
    """
    for name, value in (("tau_pos", tau_pos), ("tau_neg", tau_neg)):
        _checks.check_positive(name, value)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    ratio = jnp.exp(jnp.clip(x.logp - x.old_logp, -log_ratio_clamp, log_ratio_clamp))
    tau = jnp.where(x.advantages > 0, tau_pos, tau_neg)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0))
    return _output(-(4.0 / tau) * gate * x.advantages, 4.0 * gate * (1.0 - gate) < 0.5, x.valid)


def gspo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    sampler_logp=None,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """GSPO, token form: PPO clipping on the length-normalised sequence ratio.

    s_i = exp((1/L_i) sum_t m_it (log pi_it - log pi_old_it))
    s_it = sg(s_i) pi_it / sg(pi_it)            (value s_i, d s_it = s_i d log pi_it)
    l_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it)

    Source: Zheng et al. 2025, "Group Sequence Policy Optimization"
    (arXiv 2507.18071), eqs. for GSPO-token; eps_low = 3e-4, eps_high = 4e-4
    as in the paper. With seq_mean_token_mean aggregation and a sequence-level
    advantage this equals the sequence-level GSPO objective and gradient.

    Returns:
      PolicyLossOutput; clipped marks every token of a sequence whose ratio
      s_i was clipped.
    """
    _check_clip_range(eps_low, eps_high)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    sequence_log_ratio = _sequence_mean(x.logp - x.old_logp, x.valid)
    token_log_ratio = sg(sequence_log_ratio)[:, None] + x.logp - sg(x.logp)
    ratio = jnp.exp(jnp.clip(token_log_ratio, -log_ratio_clamp, log_ratio_clamp))
    loss, clipped = _pessimistic_clip(ratio, x.advantages, eps_low, eps_high)
    return _output(loss, clipped, x.valid)


def gmpo_loss(
    logp,
    old_logp,
    advantages,
    mask,
    *,
    sampler_logp=None,
    eps_low: float = 0.4,
    eps_high: float = 0.4,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """GMPO, token form: geometric mean of sign-aware clipped token ratios.

    c_it = sign(A) min(sign(A) lr_it, sign(A) clip(lr_it, -eps_low, eps_high)),
           lr_it = log pi_it - log pi_old_it
    R_i = exp((1/L_i) sum_t m_it c_it)                  (geometric-mean ratio)
    l_it = -A_it sg(R_i) exp(c_it - sg(c_it))           (value -A R_i)

    Source: Zhao et al. 2025, "Geometric-Mean Policy Optimization"
    (arXiv 2507.20673), clip range (e^-0.4, e^0.4). The paper's sequence loss
    is -A_i R_i; with seq_mean_token_mean aggregation the token form above
    gives the same value and gradient (d R_i = R_i (1/L_i) sum_t d c_it).

    Returns:
      PolicyLossOutput; clipped marks tokens whose log-ratio was clipped.
    """
    _check_clip_range(eps_low, eps_high)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    log_ratio = x.logp - x.old_logp
    sign = jnp.sign(x.advantages)
    clipped_log_ratio = jnp.clip(log_ratio, -eps_low, eps_high)
    clip_binds = sign * clipped_log_ratio < sign * log_ratio
    chosen = jnp.where(clip_binds, clipped_log_ratio, log_ratio)
    sequence_ratio = jnp.exp(
        jnp.clip(_sequence_mean(chosen, x.valid), -log_ratio_clamp, log_ratio_clamp)
    )
    token_ratio = sg(sequence_ratio)[:, None] * jnp.exp(chosen - sg(chosen))
    return _output(-x.advantages * token_ratio, clip_binds, x.valid)


def is_pg_sequence_loss(
    logp, old_logp, advantages, mask, *, sampler_logp=None, cap: float
) -> PolicyLossOutput:
    """Sequence-level importance-weighted policy gradient (IS-PG).

    rho_i = exp(sum_t m_it (sg(log pi_it) - log mu_it))
    l_it = -min(rho_i, C) A_it log pi_it

    Source: Qi et al. 2025, "Defeating the Training-Inference Mismatch via
    FP16" (Precision-RL, arXiv 2510.26788). mu is the sampler: pass
    sampler_logp; without it old_logp stands in for mu (the sampler and the
    learner then agree by assumption). The cap is taken in log space, so a
    huge rho never overflows.

    Args:
      cap: C > 0, the truncation of the sequence weight.
    Returns:
      PolicyLossOutput; clipped marks the tokens of sequences with rho_i > C.
    """
    _checks.check_positive("cap", cap)
    x = _token_inputs(logp, old_logp, advantages, mask, sampler_logp)
    behaviour_logp = x.old_logp if x.sampler_logp is None else x.sampler_logp
    log_rho = jnp.sum(jnp.where(x.valid, sg(x.logp) - behaviour_logp, 0.0), axis=1)
    log_cap = float(np.log(cap)) if _checks.is_concrete(cap) else jnp.log(cap)
    weight = jnp.exp(jnp.minimum(log_rho, log_cap))
    clipped = jnp.broadcast_to((log_rho > log_cap)[:, None], x.valid.shape)
    return _output(-weight[:, None] * x.advantages * x.logp, clipped, x.valid)


def clipped_value_loss(values, old_values, returns, mask, *, clip_range: float | None = 0.2) -> jax.Array:
    """PPO critic loss with value clipping, per token.

    l_it = 1/2 max((V - R)^2, (V_old + clip(V - V_old, -c, c) - R)^2)
    (without clipping: 1/2 (V - R)^2)

    Source: the PPO2 baselines implementation (Dhariwal et al. 2017); as
    used for LLMs in Ouyang et al. 2022. values is differentiable; old_values
    and returns are constants.

    Returns:
      [N, T] float32, 0 on invalid tokens.
    """
    for array in (values, old_values, returns):
        _checks.check_float(array, 2)
    _checks.check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask)
    valid = _checks.valid_tokens(mask)
    values = _checks.masked_zero(_checks.to_float32(values), valid)
    old_values = _checks.masked_zero(sg(_checks.to_float32(old_values)), valid)
    returns = _checks.masked_zero(sg(_checks.to_float32(returns)), valid)
    loss = jnp.square(values - returns)
    if clip_range is not None:
        _checks.check_positive("clip_range", clip_range)
        clipped_values = old_values + jnp.clip(values - old_values, -clip_range, clip_range)
        loss = jnp.maximum(loss, jnp.square(clipped_values - returns))
    return jnp.where(valid, 0.5 * loss, 0.0)


POLICY_LOSSES = {
    "pg": pg_loss,
    "ppo_clip": ppo_clip_loss,
    "cispo": cispo_loss,
    "sapo": sapo_loss,
    "gspo": gspo_loss,
    "gmpo": gmpo_loss,
    "is_pg_sequence": is_pg_sequence_loss,
}
