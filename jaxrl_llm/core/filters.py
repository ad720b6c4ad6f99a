"""Sampling-side filters and reward shaping (docs/objectives.md#filters-and-reward-shaping).

Filters here return keep masks; applying them to the token mask BEFORE
`aggregation.token_weights` is what removes the filtered responses from the
loss denominators (renormalising), exactly as if they had been dropped.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks


def zero_variance_group_mask(rewards) -> jax.Array:
    """Keep mask of groups whose rewards are not all equal.

    keep_pg = 1 if exists g, g': r_pg != r_pg' else 0

    A group with equal rewards has zero advantage under every group baseline
    and only dilutes the batch. Source: DAPO dynamic sampling (Yu et al.
    2025, arXiv 2503.14476); Olmo 3 "active sampling" (Olmo Team 2025).

    Args:
      rewards: [P, G].
    Returns:
      [P, G] float32 in {0, 1} (constant along each group); G = 1 gives 0.
    """
    chex.assert_rank(rewards, 2)
    rewards = _checks.to_float32(rewards)
    varied = jnp.any(rewards != rewards[:, :1], axis=1, keepdims=True)
    return jnp.broadcast_to(varied, rewards.shape).astype(jnp.float32)


def expand_group_mask(keep, mask) -> jax.Array:
    """Applies a [P, G] keep mask to the [N, T] token mask (prompt-major rows).

    m'_it = m_it keep_(i // G, i % G)

    Returns:
      [N, T] float32 in {0, 1}.
    """
    chex.assert_rank(keep, 2)
    valid = _checks.valid_tokens(mask)
    _checks.check_rows_match(jnp.shape(keep), valid.shape, what="keep")
    return (valid & (jnp.asarray(keep).reshape(-1, 1) != 0)).astype(jnp.float32)


def mask_truncated(mask, truncated) -> jax.Array:
    """Overlong filtering: removes truncated responses (no EOS) from the loss.

    m'_it = m_it [not truncated_i]

    Source: DAPO "overlong filtering" (Yu et al. 2025). Weights recomputed on
    the result renormalise over the kept responses.

    Args:
      mask: [N, T].
      truncated: [N] bool, True where generation hit the length limit.
    Returns:
      [N, T] float32 in {0, 1}.
    """
    chex.assert_rank(truncated, 1)
    valid = _checks.valid_tokens(mask)
    if jnp.shape(truncated)[0] != valid.shape[0]:
        raise ValueError(
            f"truncated shape {tuple(jnp.shape(truncated))} does not match mask shape "
            f"{valid.shape}: need one flag per row"
        )
    return (valid & ~jnp.asarray(truncated, bool)[:, None]).astype(jnp.float32)


def overlong_penalty(lengths, *, max_length: int, buffer: int, factor: float = 1.0) -> jax.Array:
    """DAPO soft overlong punishment, added to the reward.

    R_len(L) = 0                                  if L <= L_max - buf
             = -(L - (L_max - buf)) / buf * f     if L_max - buf < L <= L_max
             = -f                                 if L > L_max

    Source: Yu et al. 2025, DAPO (arXiv 2503.14476), eq. 13 (L_max = 20480,
    buf = 4096, f = 1 in the paper).

    Args:
      lengths: response lengths, any shape.
      max_length: L_max, the generation limit.
      buffer: 0 < buf <= L_max, the length of the ramp.
      factor: f >= 0, the full penalty.
    Returns:
      float32 penalties (<= 0) of the shape of `lengths`.
    """
    _checks.check_positive("max_length", max_length)
    _checks.check_positive("buffer", buffer)
    _checks.check_positive("factor", factor, allow_zero=True)
    if _checks.all_concrete(max_length, buffer) and buffer > max_length:
        raise ValueError(f"buffer must be <= max_length, got buffer={buffer}, max_length={max_length}")
    lengths = _checks.to_float32(lengths)
    ramp = -(lengths - (max_length - buffer)) / buffer * factor
    return jnp.clip(ramp, -factor, 0.0)
