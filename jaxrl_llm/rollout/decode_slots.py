"""Slot decode: a fixed batch of B slots over one KV cache of C slots, refilled as samples finish.

The decode path for accelerators (`JaxSampler`'s ``decode="slots"``, the default on GPU/TPU).
Where the compacting decode (`rollout.jax_sampler._generate`) shrinks its batch through a dozen
row counts, each a separate loop to compile with a branch per cache window, this one compiles a
single ``lax.while_loop`` per (slots, cache length, prompt bucket) with no branch on the filled
length: every step computes all B slots and attends over each row's own filled prefix
(`models.decode_attention`, dense or a fused kernel).

In-flight batching (the continuous batching of Yu et al. 2022, "Orca", OSDI): a call's N samples
(N may exceed B) are queued in output-row order; when a slot's sample ends (a stop token or its
max_tokens) the next queued sample takes the slot in the same step: the slot's cache gets that
sample's prefilled prompt (each distinct prompt is prefilled once, as in the compacting decode),
its length is reset to the prompt's, and its next logits are the prompt's. So long-tailed lengths
keep the batch full instead of leaving finished rows in it.

Layout: a row's tokens sit at cache slots 0, 1, ... (prompts are right-padded for the prefill and
copied unshifted), so row b's visible keys are the prefix [0, lengths[b]) and its next token goes
to slot lengths[b], which is also its position. Slots past a row's length hold a previous
sample's leftovers, never read.

Same samples as the compacting decode: the uniform of output row r's token t is the same element of
the same draw (`sampling.row_uniforms`), whichever slot computes it and whoever shares the batch,
and the token is drawn by the same `sampling.draw`; so in float32 the two paths give the same
tokens and log-probs up to the rounding of a different reduction order (tests/rollout/test_decode_slots.py).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import DecoderConfig, batch_invariant as invariant, forward, init_cache, lm_head_logits
from jaxrl_llm.models.decode_attention import CACHE_MULTIPLE
from jaxrl_llm.models.decoder import Decoder
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout
from jaxrl_llm.rollout.sampler_routing import SampledRouting, empty_completion_experts, record_step
from jaxrl_llm.rollout.sampling import draw, row_uniforms


class PromptCache(NamedTuple):
    """The distinct prompts after their prefill: k/v [nL, P, Lp, Hkv, hd] (a prompt's tokens at
    slots 0..length-1), lengths [P], logits [P, V] (log-probs for the batch-invariant head);
    ``experts`` [P, Lp, nL, k] the prefill's routed experts (``record_routing``; else None)."""
    k: jax.Array
    v: jax.Array
    lengths: jax.Array
    logits: jax.Array
    experts: jax.Array | None = None


class Slots(NamedTuple):
    """The decode loop's state. Per slot [B]: ``sample`` (its output row; -1: empty), ``step`` (tokens
    its sample has drawn), ``lengths`` (cache slots filled = position of its next token),
    ``logits`` [B, V]. ``next_sample``: the first output row not yet given a slot. out_* [N, ...]."""
    kv: dict
    lengths: jax.Array
    sample: jax.Array
    step: jax.Array
    logits: jax.Array
    next_sample: jax.Array
    out_tokens: jax.Array
    out_logprobs: jax.Array
    out_lengths: jax.Array
    out_stopped: jax.Array
    out_experts: jax.Array | None = None  # [N, max_tokens, nL, k] (record_routing; rollout.sampler_routing)


def sampling_head(params, cfg: DecoderConfig, batch_invariant: bool, scale: jax.Array):
    """final hidden [B, D] -> logits [B, V] (batch-invariant: log-probs at temperature ``scale``)."""
    if batch_invariant:
        tied = cfg.tie_word_embeddings
        return functools.partial(invariant.head_logprobs, weight=params["embed" if tied else "lm_head"], tied=tied,
                                 temperature=scale)
    return functools.partial(lm_head_logits, params=params, cfg=cfg)


def prefill_prompts(params, cfg: DecoderConfig, tokens: jax.Array, mask: jax.Array, head,
                    batch_invariant: bool, record_routing: bool = False) -> PromptCache:
    """Right-padded prompts tokens/mask [P, Lp] -> their `PromptCache` (one forward with a fresh cache)."""
    count, width = tokens.shape
    out = forward(params, cfg, tokens, attention_mask=mask, cache=init_cache(cfg, count, width),
                  return_hidden=True, batch_invariant=batch_invariant, return_routing=record_routing)
    hidden, cache = out[0], out[1]
    lengths = jnp.sum(mask, axis=1, dtype=jnp.int32)
    return PromptCache(cache["k"], cache["v"], lengths, head(hidden[jnp.arange(count), lengths - 1]),
                       out[2].experts if record_routing else None)


def refill(state: Slots, prompts: PromptCache, source_rows: jax.Array, total: jax.Array,
           freed: jax.Array) -> Slots:
    """Give the ``freed`` slots [B] the next queued samples (output rows next_sample.., below
    ``total``), in slot order; freed slots left without one become empty (-1). A refilled slot
    holds its prompt's cache at slots 0..Lp-1, the prompt's length and logits, and step 0."""
    width = prompts.k.shape[2]
    candidate = state.next_sample + jnp.cumsum(freed, dtype=jnp.int32) - 1
    gets = freed & (candidate < total)
    sample = jnp.where(gets, candidate, jnp.where(freed, -1, state.sample))
    state = state._replace(sample=sample, next_sample=state.next_sample + jnp.sum(gets, dtype=jnp.int32))

    def fill(s: Slots) -> Slots:
        source = source_rows[jnp.clip(candidate, 0, source_rows.shape[0] - 1)]
        # a select per slot, not a scatter to computed slots: on a mesh each device fills its own slots
        refilled = gets[None, :, None, None, None]
        kv = {name: s.kv[name].at[:, :, :width].set(jnp.where(refilled, cache[:, source].astype(s.kv[name].dtype),
                                                              s.kv[name][:, :, :width]))
              for name, cache in (("k", prompts.k), ("v", prompts.v))}
        return s._replace(kv=kv, lengths=jnp.where(gets, prompts.lengths[source], s.lengths),
                          logits=jnp.where(gets[:, None], prompts.logits[source], s.logits),
                          step=jnp.where(gets, 0, s.step))

    return jax.lax.cond(jnp.any(gets), fill, lambda s: s, state)


def on_mesh(state: Slots, layout: SamplerLayout | None) -> Slots:
    """The loop state in the sampler's layout (`rollout.sampler_mesh`; None: as XLA places it):
    slots over "data", the cache's KV heads over "tensor"."""
    if layout is None:
        return state
    return state._replace(kv={name: layout.cache(cache) for name, cache in state.kv.items()},
                          lengths=layout.rows(state.lengths), sample=layout.rows(state.sample),
                          step=layout.rows(state.step), logits=layout.rows(state.logits))


@functools.partial(jax.jit, static_argnames=("cfg", "max_tokens", "slots", "top_k", "use_top_p", "first_row",
                                             "kernel", "batch_invariant", "record_routing", "layout"))
def generate_slots(params, cfg: DecoderConfig, prompt_tokens, prompt_mask, key, temperature, top_p, stop_ids,
                   source_rows, total, *, max_tokens: int, slots: int, top_k: int | None, use_top_p: bool,
                   first_row: int = 0, kernel: str = "dense", batch_invariant: bool = False,
                   record_routing: bool = False, layout: SamplerLayout | None = None):
    """prompt_tokens/prompt_mask [P, Lp] RIGHT-padded distinct prompts -> (tokens [N, max_tokens],
    logprobs [N, max_tokens], lengths [N], stopped [N]) for output rows 0..total-1 (row i continues
    prompt ``source_rows[i]``; rows from ``total`` to N = len(source_rows) are batch filler, never
    sampled), decoded in ``slots`` slots over a cache of Lp + max_tokens slots, rounded up to a multiple
    of `models.decode_attention.CACHE_MULTIPLE` (module doc).
    The uniform of row i's token t is element first_row + i of a [first_row + N] draw under
    fold_in(key, t), as in `jax_sampler._generate` called with the same N rows.
    ``kernel``: the decode attention (`models.decode_attention`; resolved, not "auto").
    ``batch_invariant``: `models.batch_invariant`'s ops (the learner's numbers), the dense kernel.
    ``record_routing`` (MoE configs): a fifth output, `sampler_routing.SampledRouting`.
    ``layout``: the sampler's mesh layout (`rollout.sampler_mesh`; params placed by its `placer`)."""
    rows, width = source_rows.shape[0], prompt_tokens.shape[1]
    capacity = -(-(width + max_tokens) // CACHE_MULTIPLE) * CACHE_MULTIPLE  # slots past width + max_tokens: unused
    greedy = temperature == 0.0  # the most likely token; logprobs at temperature 1
    scale = jnp.where(greedy, 1.0, temperature)
    head = sampling_head(params, cfg, batch_invariant, scale)
    if layout is not None:  # the prefill's rows over "data"
        prompt_tokens, prompt_mask = layout.rows(prompt_tokens), layout.rows(prompt_mask)
    prompts = prefill_prompts(params, cfg, prompt_tokens, prompt_mask, head, batch_invariant, record_routing)
    if layout is not None:  # one gather of the prompts' cache to every "data" row, not one per refill
        prompts = prompts._replace(k=layout.cache(prompts.k, split_rows=False), v=layout.cache(prompts.v, False))
    decoder = Decoder(cfg, batch_invariant=batch_invariant, decode_kernel=None if batch_invariant else kernel)
    empty = init_cache(cfg, slots, capacity)

    def body(s: Slots) -> Slots:
        active = s.sample >= 0
        uniform = row_uniforms(key, s.step, jnp.maximum(s.sample, 0), first_row + rows, first_row)
        token, logp = draw(s.logits, uniform, greedy, scale, top_k, top_p, use_top_p, batch_invariant)
        out_row = jnp.where(active, s.sample, rows)  # empty slots write nowhere (dropped)
        stopped = active & jnp.any(token[:, None] == stop_ids[None, :], axis=-1)
        finished = active & (stopped | (s.step + 1 >= max_tokens))
        going = active & ~finished
        write = jnp.where(going, s.lengths, capacity)[:, None]  # [B, 1]; capacity: no write
        position = jnp.minimum(s.lengths, capacity - 1)[:, None]
        visible = jnp.arange(capacity)[None, None, :] <= position[:, :, None]
        out = decoder.apply({"params": params}, token[:, None], position, visible, s.kv, write,
                            return_hidden=True, return_routing=record_routing)
        experts = record_step(s.out_experts, out_row, s.step, out[2].experts) if record_routing else None
        s = Slots(out[1], s.lengths + going, s.sample, s.step + going, head(out[0][:, 0]), s.next_sample,
                  s.out_tokens.at[out_row, s.step].set(token, mode="drop"),
                  s.out_logprobs.at[out_row, s.step].set(logp, mode="drop"),
                  s.out_lengths.at[out_row].set(s.step + 1, mode="drop"),
                  s.out_stopped.at[out_row].set(stopped, mode="drop"), experts)
        return on_mesh(refill(s, prompts, source_rows, total, finished), layout)

    start = Slots({"k": empty["k"], "v": empty["v"]}, jnp.ones((slots,), jnp.int32), jnp.full((slots,), -1, jnp.int32),
                  jnp.zeros((slots,), jnp.int32), jnp.zeros((slots, prompts.logits.shape[-1]), prompts.logits.dtype),
                  jnp.zeros((), jnp.int32), jnp.zeros((rows, max_tokens), jnp.int32),
                  jnp.zeros((rows, max_tokens), jnp.float32), jnp.zeros((rows,), jnp.int32), jnp.zeros((rows,), bool),
                  empty_completion_experts(cfg, rows, max_tokens) if record_routing else None)
    state = on_mesh(refill(start, prompts, source_rows, total, jnp.ones((slots,), bool)), layout)
    state = jax.lax.while_loop(lambda s: jnp.any(s.sample >= 0), body, state)
    out = state.out_tokens, state.out_logprobs, state.out_lengths, state.out_stopped
    if not record_routing:
        return out
    return out + (SampledRouting(prompts.experts.astype(state.out_experts.dtype), state.out_experts),)
