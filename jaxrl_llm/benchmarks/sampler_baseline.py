"""The JAX sampler's decode program before the issue-15 speed-ups (commit bcc58cf),
kept unchanged as the "before" of paired timings (`jaxrl_llm.benchmarks.decode_profile`):
Gumbel-max over the whole vocabulary each step and a second log-softmax even
when no filter is active. Same arguments as `jaxrl_llm.rollout.jax_sampler._generate`.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from jaxrl_llm.models import DecoderConfig, forward, init_cache, lm_head_logits
from jaxrl_llm.rollout import jax_sampler


def filtered_logprobs(logits: jax.Array, temperature: jax.Array, top_k: int | None, top_p: jax.Array,
                      use_top_p: bool) -> jax.Array:
    """The old sampling distribution: today's `jax_sampler.filtered_logprobs`, renormalised
    once more when no filter is active (today's skips that redundant log-softmax; with a
    filter both renormalise once). The same operations, so the same program: the lowered
    `generate_baseline` text was checked equal to that of the frozen copy it replaces."""
    logp = jax_sampler.filtered_logprobs(logits, temperature, top_k, top_p, use_top_p)
    if top_k is None and not use_top_p:
        return jax.nn.log_softmax(logp, axis=-1)
    return logp


@functools.partial(jax.jit, static_argnames=("cfg", "max_tokens", "top_k", "use_top_p", "first_row"))
def generate_baseline(params, cfg: DecoderConfig, prompt_tokens, prompt_mask, key, temperature, top_p, stop_ids, *,
              max_tokens: int, top_k: int | None, use_top_p: bool, first_row: int = 0):
    """prompt_tokens/prompt_mask [B, Lp] left-padded -> (tokens [B, max_tokens],
    logprobs [B, max_tokens], lengths [B], stopped [B])."""
    batch, prompt_len = prompt_tokens.shape
    cache = init_cache(cfg, batch, prompt_len + max_tokens)
    hidden, cache = forward(params, cfg, prompt_tokens, attention_mask=prompt_mask, cache=cache, return_hidden=True)
    last_logits = lm_head_logits(hidden[:, -1], params, cfg)

    def sample(logits, step):
        logp = filtered_logprobs(logits, temperature, top_k, top_p, use_top_p)
        # Rows first_row.. of a [first_row + B, V] draw: with JAX's partitionable threefry an
        # element's noise depends on its index only, so a split batch draws the noise of one call.
        shape = (first_row + logp.shape[0], logp.shape[1])
        gumbel = jax.random.gumbel(jax.random.fold_in(key, step), shape, jnp.float32)[first_row:]
        token = jnp.argmax(logp + gumbel, axis=-1).astype(jnp.int32)
        return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]

    def cond(state):
        step, _, _, _, done, _, _ = state
        return (step < max_tokens) & ~jnp.all(done)

    def body(state):
        step, cache, logits, lengths, done, tokens, logprobs = state
        token, logp = sample(logits, step)
        active = ~done
        tokens = tokens.at[:, step].set(jnp.where(active, token, 0))
        logprobs = logprobs.at[:, step].set(jnp.where(active, logp, 0.0))
        lengths = lengths + active.astype(jnp.int32)
        done = done | (active & jnp.any(token[:, None] == stop_ids[None, :], axis=-1))
        hidden, cache = forward(params, cfg, token[:, None], attention_mask=active[:, None], cache=cache,
                                return_hidden=True)
        return step + 1, cache, lm_head_logits(hidden[:, 0], params, cfg), lengths, done, tokens, logprobs

    state = (jnp.zeros((), jnp.int32), cache, last_logits, jnp.zeros((batch,), jnp.int32),
             jnp.zeros((batch,), bool), jnp.zeros((batch, max_tokens), jnp.int32),
             jnp.zeros((batch, max_tokens), jnp.float32))
    _, _, _, lengths, done, tokens, logprobs = jax.lax.while_loop(cond, body, state)
    return tokens, logprobs, lengths, done
