"""The JAX sampler's record of routed experts: each forwarded token's top-k experts in every MoE layer,
in `RolloutRecord.routed_experts`'s format (the vLLM engine's too, `rollout.routed_experts`), for
routing replay (R3: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and
Inference Routers", arXiv 2510.11370).

On the device the decode loops (`jax_sampler._generate`, `decode_slots.generate_slots`) keep
`SampledRouting`: the prefill's experts of each distinct prompt and, per output row and step, the
experts of the completion token that step forwarded (in the narrowest integer type that holds an
expert index, `experts_dtype`: the [rows, max_tokens, layers, k] buffer is the largest one the option adds).
`sample_routed_experts` assembles one sample's rows on the host: its prompt's rows (shared by the
prompt's n samples), then completion tokens 0..L-2 (the last sampled token has no row: its output
predicts nothing).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import DecoderConfig


class SampledRouting(NamedTuple):
    """``prompt`` [P, Lp, nL, k]: the experts of each distinct prompt's padded prefill (the real tokens'
    rows are those of the prompt mask); ``completion`` [N, max_tokens, nL, k]: row i, step t = the experts
    used when output row i's completion token t was the input (rows never forwarded: 0)."""
    prompt: jax.Array
    completion: jax.Array


def experts_dtype(num_experts: int) -> jnp.dtype:
    """The narrowest integer dtype that holds expert indices 0..num_experts-1 (uint8 up to 256 experts)."""
    if num_experts <= 256:
        return jnp.dtype(jnp.uint8)
    return jnp.dtype(jnp.int16) if num_experts <= 32767 else jnp.dtype(jnp.int32)


def check_routing_option(cfg: DecoderConfig, return_routed_experts: bool) -> bool:
    """``return_routed_experts`` as a bool; ValueError naming the architecture for a dense config."""
    if return_routed_experts not in (True, False):
        raise ValueError(f"return_routed_experts must be True or False, got {return_routed_experts!r}")
    if return_routed_experts and not cfg.is_moe:
        raise ValueError(f"return_routed_experts=True needs a mixture-of-experts policy; {cfg.architecture} is dense "
                         "(it routes no token); valid: return_routed_experts=False")
    return bool(return_routed_experts)


def empty_completion_experts(cfg: DecoderConfig, rows: int, max_tokens: int) -> jax.Array:
    """The decode loops' zeroed [rows, max_tokens, nL, k] buffer of completion experts."""
    return jnp.zeros((rows, max_tokens, cfg.num_layers, cfg.num_experts_per_tok), experts_dtype(cfg.num_experts))


def record_step(completion: jax.Array, out_row: jax.Array, step: jax.Array, experts: jax.Array) -> jax.Array:
    """Write one decode step's experts [b, 1, nL, k] at (out_row [b], step) (rows out of range dropped;
    ``step`` a scalar or [b])."""
    return completion.at[out_row, step].set(experts[:, 0].astype(completion.dtype), mode="drop")


def sample_routed_experts(prompt_rows: np.ndarray, completion_rows: np.ndarray, length: int) -> np.ndarray:
    """int32 [P + L - 1, nL, k]: a prompt's P real rows [P, nL, k], then the sample's completion rows
    [>= L - 1, nL, k] of tokens 0..L-2."""
    if length < 1:
        raise ValueError(f"a sample has at least one completion token, got length {length}")
    return np.concatenate([prompt_rows, completion_rows[:length - 1]]).astype(np.int32)
