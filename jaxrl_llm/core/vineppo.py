"""VinePPO credit assignment: Monte-Carlo values at chunk boundaries instead of a critic.

Kazemnejad et al. 2024, "VinePPO: Unlocking RL Potential for LLM Reasoning Through
Refined Credit Assignment" (arXiv 2410.01679). A response y_1..y_L to prompt x is cut
into chunks starting at positions b_0 = 0 < b_1 < ... < b_m < L (every k tokens, or
after each newline token). From each chunk start the rollout engine samples K
continuations of the prefix (x, y_<b_j); the value of that state is their mean reward,

    V(b_j) = (1/K) sum_k R(continuation_k),   V(L) = R (the response's own reward),

and every token of chunk j gets the chunk's advantage (gamma = 1, no intermediate
rewards)

    A_t = V(b_{j+1}) - V(b_j)   for b_j <= t < b_{j+1},

so the chunk advantages of a response telescope: sum_j A_{b_j} = R - V(b_0), the
response's reward minus the value of the prompt. These are pure functions; the rollout
engine supplies the continuation rewards.
"""
from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks


def chunk_starts(token_ids, mask, *, every: int | None = None, newline_ids: Sequence[int] = ()) -> jax.Array:
    """bool [N, T]: True where a chunk starts (the state before that token is valued).

    Position 0 of every non-empty response starts a chunk. With `every = k`, so does
    every k-th token; with `newline_ids`, so does every token that follows one of them
    (a chunk ends with its newline). Both may be given. Only valid tokens start chunks.
    """
    valid = _checks.valid_tokens(mask)
    if every is None and not newline_ids:
        raise ValueError("chunk_starts needs every=k (k >= 1) or newline_ids (token ids that end a chunk)")
    if every is not None and (not isinstance(every, (int, np.integer)) or every < 1):
        raise ValueError(f"every={every!r}; valid: an int >= 1")
    width = valid.shape[1]
    position = jnp.arange(width)[None, :]
    starts = position == 0
    if every is not None:
        starts = starts | (position % every == 0)
    if newline_ids:
        token_ids = jnp.asarray(token_ids)
        after_newline = jnp.isin(token_ids, jnp.asarray(list(newline_ids)))
        starts = starts | jnp.pad(after_newline[:, :-1], ((0, 0), (1, 0)))
    return starts & valid


def mc_values(continuation_rewards) -> tuple[jax.Array, jax.Array]:
    """(mean, standard error) over the last axis of [..., K] continuation rewards: the
    Monte-Carlo value of each state and its sampling error sqrt(var / K) (ddof = 1)."""
    rewards = _checks.to_float32(continuation_rewards)
    k = rewards.shape[-1]
    if k < 1:
        raise ValueError("mc_values needs at least one continuation per state")
    mean = jnp.mean(rewards, axis=-1)
    spread = jnp.std(rewards, axis=-1, ddof=1) if k > 1 else jnp.zeros_like(mean)
    return mean, spread / jnp.sqrt(k)


def chunk_advantages(start_values, starts, rewards, mask) -> jax.Array:
    """Per-token VinePPO advantages A_t = V(next chunk start) - V(this chunk's start).

    Args:
      start_values: [N, T] V(b_j) at the chunk starts (ignored elsewhere).
      starts: [N, T] bool from `chunk_starts` (position 0 of each valid row must be one).
      rewards: [N] each response's own reward R = V(L), the value after its last token.
      mask: [N, T] response mask.
    Returns:
      [N, T] float32, 0 on invalid tokens; each chunk's tokens share its advantage.
    """
    valid = _checks.valid_tokens(mask)
    starts = jnp.asarray(starts, bool) & valid
    _checks.check_same_shape(start_values=start_values, starts=starts, mask=mask)
    values = _checks.to_float32(start_values)
    rewards = _checks.to_float32(rewards).reshape(-1)
    width = valid.shape[1]
    position = jnp.broadcast_to(jnp.arange(width), valid.shape)
    # this chunk's start: the last start at or before t
    current = jax.lax.cummax(jnp.where(starts, position, -1), axis=1)
    # the next chunk's start: the first start after t (width: none, the response ends)
    following = jnp.where(starts, position, width)
    following = jnp.concatenate([following[:, 1:], jnp.full((valid.shape[0], 1), width)], axis=1)
    following = jax.lax.cummin(following, axis=1, reverse=True)
    gather = lambda idx: jnp.take_along_axis(values, jnp.clip(idx, 0, width - 1), axis=1)  # noqa: E731
    v_before = gather(current)
    v_after = jnp.where(following < width, gather(following), rewards[:, None])
    return jnp.where(valid, v_after - v_before, 0.0)
