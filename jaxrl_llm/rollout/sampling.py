"""Drawing one token per row from a step's logits: the sampling distribution (temperature,
top-k, top-p nucleus; Holtzman et al. 2020) and inversion sampling with one uniform per row.
Shared by the two decode paths, `rollout.jax_sampler` (compacting batch) and
`rollout.decode_slots` (fixed slots with refill), so both draw the same tokens.

Each row's uniform for its token t is element ``first_row + row`` of
``jax.random.uniform(fold_in(key, t), (first_row + rows,))``, row its output row
(`row_uniforms`): a row's noise does not depend on where it is computed.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

_NEG_INF = -jnp.inf


def filtered_logprobs(logits: jax.Array, temperature: jax.Array, top_k: int | None, top_p: jax.Array,
                      use_top_p: bool) -> jax.Array:
    """log of the sampling distribution: softmax(logits / T) restricted to top-k and
    the top-p nucleus, renormalised; excluded tokens get -inf. Float32 throughout."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logp, top_k)[0][..., -1:]
        logp = jnp.where(logp >= kth, logp, _NEG_INF)
    if use_top_p:
        sorted_logp = jnp.sort(logp, axis=-1)[..., ::-1]
        probs = jnp.exp(sorted_logp)
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        # Keep a token while the mass strictly before it is < top_p: the smallest
        # nucleus with mass >= top_p (the most likely token is always kept).
        keep_sorted = mass_before < top_p
        threshold = jnp.min(jnp.where(keep_sorted, sorted_logp, jnp.inf), axis=-1, keepdims=True)
        logp = jnp.where(logp >= threshold, logp, _NEG_INF)
    if top_k is None and not use_top_p:  # nothing removed: already normalised, as the learner computes it
        return logp
    return jax.nn.log_softmax(logp, axis=-1)


def inverse_cdf_choice(logp: jax.Array, uniform: jax.Array, block: int = 256) -> jax.Array:
    """Token drawn from exp(logp) [B, V] by inversion with one uniform [B] in [0, 1) per row.

    Returns for each row the first index whose cumulative mass exceeds ``uniform * total``:
    token i is chosen for a fraction p_i / total of the uniform's range, so the draw
    follows the (renormalised) distribution, and a token of probability 0 is never chosen
    (its cumulative mass equals its predecessor's). The cumulative sum runs in two levels,
    within blocks of ``block`` tokens and over the block totals, so the work is O(V) and
    the search reads one block per row: only the chosen block's running sum is formed,
    because XLA:CPU lowers a cumulative sum at block^2 work per block, so a running sum over
    every block would dominate the draw (docs/benchmarks.md, the sampler section). Float32:
    the interval of each token is exact up to float32 rounding of the sums (relative ~1e-7)."""
    batch, vocab = logp.shape
    padded = -(-vocab // block) * block
    probs = jnp.exp(logp.astype(jnp.float32))
    probs = jnp.pad(probs, ((0, 0), (0, padded - vocab))).reshape(batch, padded // block, block)
    block_mass = jnp.sum(probs, axis=-1)  # [B, nb]
    block_end = jnp.cumsum(block_mass, axis=-1)  # [B, nb] inclusive, over blocks
    target = uniform * block_end[:, -1]
    positive_blocks = block_mass > 0
    last_block = (positive_blocks.shape[-1] - 1 - jnp.argmax(positive_blocks[:, ::-1], axis=-1)).astype(jnp.int32)
    chosen_block = jnp.sum(block_end <= target[:, None], axis=-1, dtype=jnp.int32)
    chosen_block = jnp.minimum(chosen_block, last_block)  # target rounded up to the total: last non-empty block
    block_begin = jnp.pad(block_end[:, :-1], ((0, 0), (1, 0)))  # exclusive: the same sums the choice compared
    block_start = jnp.take_along_axis(block_begin, chosen_block[:, None], axis=-1)[:, 0]
    in_probs = probs[jnp.arange(batch), chosen_block]  # [B, block]
    in_block = jnp.cumsum(in_probs, axis=-1)
    offset = jnp.sum(in_block <= (target - block_start)[:, None], axis=-1, dtype=jnp.int32)
    last_positive = (block - 1 - jnp.argmax(in_probs[:, ::-1] > 0, axis=-1)).astype(jnp.int32)
    offset = jnp.minimum(offset, last_positive)  # rounding past the block's sum: its last token of mass > 0
    return chosen_block * block + offset



def row_uniforms(key: jax.Array, steps: jax.Array, rows: jax.Array, size: int, first_row: int = 0) -> jax.Array:
    """The uniform of output row ``rows[i]`` at its token ``steps[i]``: element ``first_row + rows[i]`` of
    ``jax.random.uniform(jax.random.fold_in(key, steps[i]), (size,))``, as the compacting decode draws
    a whole step at once (``size`` = first_row + its rows; with JAX's partitionable threefry the value
    depends on the index only, without it on ``size`` too, so the caller passes the same size).
    steps/rows [B] int32 -> [B] float32. Work: B x size draws (each row draws its step's vector)."""
    def one(step, row):
        return jax.random.uniform(jax.random.fold_in(key, step), (size,))[first_row + row]
    return jax.vmap(one)(steps, rows)


def draw(logits: jax.Array, uniform: jax.Array, greedy: jax.Array, scale: jax.Array, top_k: int | None,
         top_p: jax.Array, use_top_p: bool, logits_are_logprobs: bool = False) -> tuple[jax.Array, jax.Array]:
    """(token [B], its log-probability [B]) from logits [B, V] and one uniform [B] per row:
    the argmax when ``greedy``, else `inverse_cdf_choice` under `filtered_logprobs` at temperature
    ``scale``. ``logits_are_logprobs``: the rows already hold the log-probs to draw from (the
    batch-invariant head)."""
    logp = logits if logits_are_logprobs else filtered_logprobs(logits, scale, top_k, top_p, use_top_p)
    token = jnp.where(greedy, jnp.argmax(logp, axis=-1).astype(jnp.int32), inverse_cdf_choice(logp, uniform))
    return token, jnp.take_along_axis(logp, token[:, None], axis=-1)[:, 0]
