"""Advantage estimators (docs/objectives.md#advantage-estimators).

Conventions: a step holds P prompts x G samples = N responses, rows ordered
prompt-major (row i belongs to prompt i // G). Rewards are [P, G]; token
arrays and masks are [N, T] (mask 1 = valid response token).

Defined edge cases (never NaN):
  * group size G = 1: advantage 0. A lone sample is its own group mean, so no
    baseline other than itself exists; there is no relative signal to learn.
  * all rewards of a group equal: advantage exactly 0, also with std
    normalisation (0 / (0 + eps) would be 0 anyway, but the centred value is
    forced to exact 0 so float rounding of the mean cannot leak a tiny
    non-zero advantage amplified by a tiny std).
  * NaN / inf rewards: `validate_rewards` raises a ValueError naming the first
    bad (p, g). Every estimator runs it when its rewards are concrete (eager
    calls). Under jit the rewards are tracers and the check cannot run there:
    a non-finite reward then turns its own group's advantages into NaN (other
    groups are unaffected). Call `validate_rewards` on the host before the
    jitted step (`step_batch.prepare_step_batch` does when called eagerly).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks


def validate_rewards(rewards) -> None:
    """Host-side check that `rewards` is a finite [P, G] array.

    Raises:
      ValueError naming the first non-finite entry as (p, g) in row-major
      order, or the bad shape.
    """
    values = np.asarray(rewards)
    if values.ndim != 2:
        raise ValueError(f"rewards must be [P, G] (rank 2), got shape {values.shape}")
    try:
        as_float = values.astype(np.float64)
    except (TypeError, ValueError) as error:
        raise ValueError(f"rewards must be numeric, got dtype {values.dtype}") from error
    finite = np.isfinite(as_float)
    if not finite.all():
        p, g = (int(i) for i in np.argwhere(~finite)[0])
        raise ValueError(
            f"rewards[{p}, {g}] = {values[p, g]} is not finite (prompt {p}, sample {g}); "
            "rewards must be finite real numbers"
        )


def _prepare_rewards(rewards) -> jax.Array:
    """Rank check, host-side finiteness check when concrete, float32 compute."""
    chex.assert_rank(rewards, 2)
    if _checks.is_concrete(rewards):
        validate_rewards(rewards)
    return _checks.to_float32(rewards)


def _check_ddof(ddof: int, count: int, over: str) -> None:
    if not isinstance(ddof, (int, np.integer)) or ddof < 0 or ddof >= count:
        raise ValueError(f"ddof must be an integer in [0, {count - 1}] for {count} {over}, got {ddof!r}")


def _group_centred(rewards: jax.Array) -> jax.Array:
    """r_i - mean_g r, exactly 0 for groups whose rewards are all equal."""
    mean = jnp.mean(rewards, axis=1, keepdims=True)
    constant = jnp.all(rewards == rewards[:, :1], axis=1, keepdims=True)
    return jnp.where(constant, 0.0, rewards - mean)


def _safe_divide(numerator: jax.Array, denominator: jax.Array) -> jax.Array:
    """numerator / denominator, 0 where the numerator is exactly 0.

    A zero numerator here means a zero-variance group; with eps = 0 the
    denominator is 0 too and the result is defined as 0, not NaN.
    """
    zero = numerator == 0
    return jnp.where(zero, 0.0, numerator / jnp.where(zero, 1.0, denominator))


def grpo_advantages(rewards, *, ddof: int = 1, eps: float = 1e-6) -> jax.Array:
    """GRPO group-normalised advantage.

    A_i = (r_i - mean_g r) / (std_g r + eps)

    Source: Shao et al. 2024, DeepSeekMath (arXiv 2402.03300). Public
    implementations disagree on the std: verl uses torch.std (ddof=1) with
    eps=1e-6, open-instruct uses ddof=0; both are explicit arguments here.

    Args:
      rewards: [P, G] scalar rewards, P prompts x G samples.
      ddof: delta degrees of freedom of the group std (0 <= ddof < G).
      eps: added to the std (>= 0).
    Returns:
      [P, G] float32 advantages; 0 for G = 1 and for all-equal groups.
    """
    rewards = _prepare_rewards(rewards)
    group_size = rewards.shape[1]
    if group_size == 1:
        return jnp.zeros_like(rewards)
    _check_ddof(ddof, group_size, "samples per group")
    _checks.check_positive("eps", eps, allow_zero=True)
    std = jnp.std(rewards, axis=1, ddof=ddof, keepdims=True)
    return _safe_divide(_group_centred(rewards), std + eps)


def dr_grpo_advantages(rewards) -> jax.Array:
    """Dr. GRPO advantage: group mean baseline, no std division.

    A_i = r_i - mean_g r

    Source: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical
    Perspective" (arXiv 2503.20783), which shows the std division up-weights
    too-easy and too-hard prompts (see `bias.difficulty_weight`).

    Args:
      rewards: [P, G].
    Returns:
      [P, G] float32; 0 for G = 1 and for all-equal groups.
    """
    rewards = _prepare_rewards(rewards)
    return _group_centred(rewards)


def rloo_advantages(rewards) -> jax.Array:
    """REINFORCE leave-one-out advantage.

    A_i = r_i - mean_{j in g, j != i} r_j = G / (G - 1) * (r_i - mean_g r)

    Source: Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs" (arXiv 2402.14740);
    Kool et al. 2019 for the estimator.

    Args:
      rewards: [P, G].
    Returns:
      [P, G] float32; 0 for G = 1 (no other sample forms a baseline).
    """
    rewards = _prepare_rewards(rewards)
    group_size = rewards.shape[1]
    if group_size == 1:
        return jnp.zeros_like(rewards)
    return group_size / (group_size - 1) * _group_centred(rewards)


def batch_std_advantages(rewards, *, ddof: int = 1, eps: float = 1e-6) -> jax.Array:
    """Group-mean baseline scaled by the std of all rewards in the batch.

    A_i = (r_i - mean_g r) / (std_{all P*G rewards} r + eps)

    Source: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for
    LLM Reasoning" ("Lite PPO": group mean, batch std); TRL's
    scale_rewards="batch". The std is of the raw rewards over the whole batch.

    Args:
      rewards: [P, G].
      ddof: delta degrees of freedom of the batch std (0 <= ddof < P*G).
      eps: added to the std (>= 0).
    Returns:
      [P, G] float32; 0 for G = 1 and for all-equal groups.
    """
    rewards = _prepare_rewards(rewards)
    if rewards.shape[1] == 1:
        return jnp.zeros_like(rewards)
    _check_ddof(ddof, rewards.size, "rewards in the batch")
    _checks.check_positive("eps", eps, allow_zero=True)
    std = jnp.std(rewards, ddof=ddof)
    return _safe_divide(_group_centred(rewards), std + eps)


def _ratio_of_binomials(top: jax.Array, bottom: int, k: int) -> jax.Array:
    """C(top, k) / C(bottom, k) for integer-valued float arrays `top` <= bottom, as the product
    prod_j (top - j) / (bottom - j); 0 where top < k."""
    terms = [jnp.maximum(top - j, 0.0) / (bottom - j) for j in range(k)]
    return functools.reduce(jnp.multiply, terms, jnp.ones_like(top))


def pass_at_k_advantages(rewards, *, k: int) -> jax.Array:
    """Pass@k advantages in closed form: every response's mean normalised advantage over the
    size-k subsets of its group that contain it, a subset scoring 1 when any member is correct.

    With N samples of which c are correct (r > 0.5; the rewards are 0/1):
      R = 1 - C(N-c, k) / C(N, k)              the group's mean pass@k over subsets
      s = sqrt(R (1 - R))                       their std
      A_correct   = (1 - R) / s
      A_incorrect = (1 - R - C(N-c-1, k-1) / C(N-1, k-1)) / s

    Source: Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models" (arXiv 2508.10751), the analytical derivation. k = 1
    is GRPO's advantage with the population std (ddof 0) and no eps.

    Args:
      rewards: [P, G] 0/1 rewards.
      k: subset size, 1 <= k <= G.
    Returns:
      [P, G] float32; 0 in groups whose subsets all score alike (R = 0 or 1).
    """
    rewards = _prepare_rewards(rewards)
    group = rewards.shape[1]
    if not isinstance(k, int) or not 1 <= k <= group:
        raise ValueError(f"k={k!r} is invalid for groups of {group} samples; valid: an int from 1 to {group}")
    correct = rewards > 0.5
    wrong = jnp.sum(~correct, axis=1, keepdims=True).astype(jnp.float32)  # N - c
    mean = 1.0 - _ratio_of_binomials(wrong, group, k)
    std = jnp.sqrt(mean * (1.0 - mean))
    wrong_rest = _ratio_of_binomials(wrong - 1.0, group - 1, k - 1)  # subsets of the others, all wrong
    return _safe_divide(jnp.where(correct, 1.0 - mean, 1.0 - mean - wrong_rest), std)


def opo_advantages(rewards, mask) -> jax.Array:
    """OPO: a length-weighted group baseline, the variance-minimising one when each response's
    gradient norm grows with its length.

    A_it = (r_i - b_g) m_it,  b_g = sum_{j in g} L_j r_j / sum_{j in g} L_j,  L_j = sum_t m_jt

    Source: Hao et al. 2025, "On-Policy RL with Optimal Reward Baseline" (arXiv 2505.23585).

    Args:
      rewards: [P, G].
      mask: [N, T], N = P * G, non-zero on valid tokens.
    Returns:
      [N, T] float32, 0 on invalid tokens; groups of empty responses get the plain mean.
    """
    rewards = _prepare_rewards(rewards)
    valid = _checks.valid_tokens(mask)
    _checks.check_rows_match(rewards.shape, valid.shape, what="rewards")
    lengths = jnp.sum(valid, axis=1).astype(jnp.float32).reshape(rewards.shape)
    total = jnp.sum(lengths, axis=1, keepdims=True)
    weighted = jnp.sum(lengths * rewards, axis=1, keepdims=True) / jnp.maximum(total, 1.0)
    baseline = jnp.where(total > 0, weighted, jnp.mean(rewards, axis=1, keepdims=True))
    return broadcast_to_tokens(rewards - baseline, mask)


def broadcast_to_tokens(advantages, mask) -> jax.Array:
    """Copies each response's advantage onto its valid tokens.

    A_it = A_i * m_it, with response i = (p, g) = (i // G, i % G).

    Args:
      advantages: [P, G] per-response values.
      mask: [N, T], N = P * G, non-zero on valid tokens.
    Returns:
      [N, T] float32, 0 on invalid tokens.
    """
    chex.assert_rank(advantages, 2)
    valid = _checks.valid_tokens(mask)
    _checks.check_rows_match(jnp.shape(advantages), valid.shape, what="advantages")
    per_response = _checks.to_float32(advantages).reshape(-1, 1)
    return jnp.where(valid, per_response, 0.0)


def reinforce_pp_advantages(rewards, mask, *, ddof: int = 1, eps: float = 1e-6) -> jax.Array:
    """REINFORCE++-baseline: group-mean baseline, then whitened over tokens.

    a_it = (r_i - mean_g r) m_it;  A_it = (a_it - mu) / (sigma + eps),
    mu, sigma = mean and std of a over ALL valid tokens of the batch.

    Source: Hu et al. 2025, "REINFORCE++" (arXiv 2501.03262). Because the
    statistics are taken per token, long responses weigh more in mu and sigma.
    The statistics are global: call this once on the full step batch.

    Args:
      rewards: [P, G].
      mask: [N, T], N = P * G.
      ddof: delta degrees of freedom of the token std.
      eps: added to the std (>= 0).
    Returns:
      [N, T] float32, 0 on invalid tokens; 0 everywhere if all centred
      rewards are 0 (G = 1 or only all-equal groups).
    """
    centred = dr_grpo_advantages(rewards)
    per_token = broadcast_to_tokens(centred, mask)
    valid = _checks.valid_tokens(mask)
    _checks.check_positive("eps", eps, allow_zero=True)
    if not isinstance(ddof, (int, np.integer)) or ddof < 0:
        raise ValueError(f"ddof must be a non-negative integer, got {ddof!r}")
    count = jnp.sum(valid)
    mean = jnp.sum(per_token) / jnp.maximum(count, 1)
    squares = jnp.where(valid, jnp.square(per_token - mean), 0.0)
    std = jnp.sqrt(jnp.sum(squares) / jnp.maximum(count - ddof, 1))
    centred_tokens = jnp.where(std == 0, 0.0, per_token - mean)
    whitened = _safe_divide(centred_tokens, std + eps)
    return jnp.where(valid, whitened, 0.0)


def terminal_token_rewards(rewards, mask) -> jax.Array:
    """Places each response's scalar reward on its last valid token.

    r_it = r_i if t is the last t with m_it = 1, else 0.
    The input to GAE for outcome rewards (Ouyang et al. 2022 style PPO).

    Args:
      rewards: [P, G].
      mask: [N, T], N = P * G.
    Returns:
      [N, T] float32; rows without valid tokens are all 0.
    """
    rewards = _prepare_rewards(rewards)
    valid = _checks.valid_tokens(mask)
    _checks.check_rows_match(rewards.shape, valid.shape)
    width = valid.shape[1]
    last = width - 1 - jnp.argmax(valid[:, ::-1], axis=1)
    is_last = (jnp.arange(width)[None, :] == last[:, None]) & valid
    return jnp.where(is_last, rewards.reshape(-1, 1), 0.0)


class GaeOutput(NamedTuple):
    advantages: jax.Array  # [N, T]
    returns: jax.Array  # [N, T], advantages + values (critic targets)


def gae_advantages(token_rewards, values, mask, *, gamma: float, lam: float) -> GaeOutput:
    """Generalised advantage estimation over the valid tokens of each row.

    delta_t = r_t + gamma V_{t+1} - V_t
    A_t = sum_l (gamma lam)^l delta_{t+l},  returns_t = A_t + V_t

    Source: Schulman et al. 2016, "High-Dimensional Continuous Control Using
    Generalized Advantage Estimation" (arXiv 1506.02438).

    Invalid positions are skipped, not treated as steps: t+1 means the next
    valid token, and after the last valid token V = 0 (terminal). So padding
    columns (anywhere) change nothing, and their NaN values never propagate.

    Args:
      token_rewards: [N, T] per-token rewards (see `terminal_token_rewards`).
      values: [N, T] critic values V_t (treated as constants).
      mask: [N, T].
      gamma: discount in [0, 1].
      lam: GAE lambda in [0, 1].
    Returns:
      GaeOutput(advantages [N, T], returns [N, T]), float32, 0 where invalid.
    """
    _checks.check_float(values, 2)
    chex.assert_rank(token_rewards, 2)
    _checks.check_same_shape(token_rewards=token_rewards, values=values, mask=mask)
    for name, value in (("gamma", gamma), ("lam", lam)):
        if _checks.is_concrete(value) and not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    valid = _checks.valid_tokens(mask)
    rewards = _checks.masked_zero(_checks.to_float32(token_rewards), valid)
    values = _checks.masked_zero(jax.lax.stop_gradient(_checks.to_float32(values)), valid)

    def backward_step(carry, column):
        next_value, next_advantage = carry
        reward, value, is_valid = column
        delta = reward + gamma * next_value - value
        advantage = delta + gamma * lam * next_advantage
        # An invalid position passes the carry through untouched.
        carry = (jnp.where(is_valid, value, next_value), jnp.where(is_valid, advantage, next_advantage))
        return carry, jnp.where(is_valid, advantage, 0.0)

    zeros = jnp.zeros(valid.shape[0], rewards.dtype)
    _, advantages_by_column = jax.lax.scan(
        backward_step, (zeros, zeros), (rewards.T, values.T, valid.T), reverse=True
    )
    advantages = advantages_by_column.T
    returns = jnp.where(valid, advantages + values, 0.0)
    return GaeOutput(advantages, returns)
