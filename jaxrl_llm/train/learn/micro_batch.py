"""One micro-batch of the learner on the device: its rows of packed sequences (`DeviceRows`, a
`packing.RowPlan` moved to the device), the decoder and LM head over them (`head_logprobs`), and
the read-back of its completion log-probs into the step batch's [N, T_c] layout (`to_step_layout`)."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, forward
from jaxrl_llm.train.learn import critic as critic_lib


class DeviceRows(NamedTuple):
    """A `packing.RowPlan` on the device: the per-micro-batch arrays and the read-back map."""

    tokens: jax.Array  # int32 [k, R, W]
    segment_ids: jax.Array  # int32 [k, R, W]
    positions: jax.Array  # int32 [k, R, W]
    head_slots: jax.Array  # int32 [k, R * T_c]
    used: jax.Array  # bool [k]
    completion_index: jax.Array  # int32 [N, T_c]
    micro_batch: jax.Array  # int32 [N]


def head_logprobs(params, cfg: DecoderConfig, tokens, segment_ids, positions, head_slots, *, temperature: float,
                   return_entropy: bool, remat: str, max_segments: int, critic_params=None,
                   batch_invariant: bool = False, return_routing: bool = False):
    """One micro-batch: the decoder over its rows [R, W], then the LM head and log-softmax on the
    R * T_c gathered positions that predict completion tokens only (the head is ~1/5 of SmolLM2's
    FLOPs per position, so skipping prompt and padding positions is not free). ``batch_invariant``:
    `models.batch_invariant`'s ops (rows must hold one sequence each, from slot 0). Returns the flat
    [R * T_c] logprob output and, with `critic_params`, the value head's V_t there (else None);
    ``return_routing`` (MoE configs): a third element, the rows' `models.moe.Routing` [R, W, ...]."""
    result = forward(params, cfg, tokens, positions=positions, segment_ids=segment_ids, return_hidden=True,
                     remat=remat, max_segments=max_segments, batch_invariant=batch_invariant,
                     return_routing=return_routing)
    hidden = result[0]
    rows, width, dim = hidden.shape
    predicting = jnp.take(hidden.reshape(rows * width, dim), head_slots, axis=0)[None]
    targets = jnp.take(tokens.reshape(-1), head_slots + 1)[None]
    out = chunked_logprobs_from_hidden(predicting, targets, params, cfg, temperature=temperature,
                                       return_entropy=return_entropy, batch_invariant=batch_invariant)
    out = jax.tree.map(lambda x: x[0], out)
    values = None if critic_params is None else critic_lib.head_values(critic_params, predicting)[0]
    return (out, values, result[2]) if return_routing else (out, values)


def to_step_layout(flat, rows: DeviceRows, m, fill):
    """[R * T_c] values of micro-batch m -> [N, T_c]: each completion token's own where its sequence
    lives in micro-batch m, `fill` elsewhere."""
    member = (rows.micro_batch == m)[:, None]
    return jnp.where(member, jnp.take(flat, rows.completion_index), fill)
