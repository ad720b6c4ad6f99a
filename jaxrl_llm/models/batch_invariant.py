"""Batch-invariant versions of the decoder's reductions: a row's result does not depend on the other
rows, its index, the padding, or whether its tokens are computed one at a time (decode over a KV
cache) or all at once (the learner's forward).

What XLA:CPU (jaxlib 0.10) does otherwise, measured by ``python -m jaxrl_llm.reports.batch_invariance``:

* a dot's kernel, and so its summation order over the contracted axis, depends on the number of
  rows M (float32: M = 1, 2..16 and >= 33 round differently; bf16: M = 1 against M >= 2);
* a reduction (``jnp.sum``/``mean``/``logsumexp``) splits its axis by the shape of the whole
  array: the same row summed alone or among 2, 3 or 64 rows can differ in the last bit, and a
  run of zeros before or after the values changes the result.

The fixes, one mechanism each:

* `tree_sum`: the sum over an axis as a binary tree of elementwise adds of adjacent pairs,
  the axis zero-padded to a power of two. Elementwise IEEE adds round the same at any shape, and
  appending zeros only adds exact zeros at the root, so the sum of a row is a function of that
  row's values and their order alone, whatever the array's shape or the padding after them.
* `tiled_matmul`: rows of x @ w in tiles of TILE rows (zero-padded), one dot of one fixed shape
  [TILE, d] @ [d, o] per tile in a ``lax.map``: every row goes through the same kernel (a vmap
  would not do it: XLA folds the batch back into one dot of any M).
* `attention`: scores q.k and the weighted sum of values by `tree_sum` (over the head dim and
  over keys), max exact; keys are laid out by position (slot = position) in the cache and in the
  learner's rows, so the sum over keys sees the same values in the same order in both, followed
  by exact zeros for the masked slots.
* `log_softmax`: (z - max) - log(tree_sum(exp(z - max))), the one formula the sampler and the
  learner both use.

Same idea as the batch-invariant kernels of He & Thinking Machines (2025, "Defeating
Nondeterminism in LLM Inference") for GPUs: fix each reduction's order per row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

TILE = 64  # rows per dot in `tiled_matmul`


def tree_sum(x: jax.Array, axis: int = -1) -> jax.Array:
    """Sum over ``axis`` as a tree of adjacent-pair adds (the axis zero-padded to a power of two):
    the result for each output element depends only on the values along the axis, in order,
    and is unchanged by zeros appended after them."""
    axis = axis % x.ndim
    length = x.shape[axis]
    size = 1 << max(0, (length - 1).bit_length())
    if size != length:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, size - length)
        x = jnp.pad(x, pad)
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        pairs = x.reshape(x.shape[:axis] + (half, 2) + x.shape[axis + 1:])
        x = jax.lax.index_in_dim(pairs, 0, axis + 1, keepdims=False) + \
            jax.lax.index_in_dim(pairs, 1, axis + 1, keepdims=False)
    return jax.lax.index_in_dim(x, 0, axis, keepdims=False)


def tiled_matmul(x: jax.Array, w: jax.Array, *, contract_w: int = 0, out_dtype=None) -> jax.Array:
    """x [..., d] times w ([d, o], or [o, d] with ``contract_w=1``) summed in float32, every row
    through one dot of shape [TILE, d]; result in ``out_dtype`` (default x's dtype)."""
    lead, width = x.shape[:-1], x.shape[-1]
    rows = x.reshape(-1, width)
    count = rows.shape[0]
    tiles = -(-count // TILE)
    rows = jnp.pad(rows, ((0, tiles * TILE - count), (0, 0))).reshape(tiles, TILE, width)
    dims = (((1,), (contract_w,)), ((), ()))
    out = jax.lax.map(lambda tile: jax.lax.dot_general(tile, w, dims, preferred_element_type=jnp.float32), rows)
    out = out.reshape(tiles * TILE, -1)[:count]
    return out.reshape(lead + (out.shape[-1],)).astype(x.dtype if out_dtype is None else out_dtype)


def project(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w in x's dtype (summed in float32), through `tiled_matmul`."""
    return tiled_matmul(x, w.astype(x.dtype))


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``decoder.rms_norm`` with the mean of squares by `tree_sum`."""
    x32 = x.astype(jnp.float32)
    mean_square = tree_sum(x32 * x32, -1)[..., None] / x.shape[-1]
    normed = x32 * jax.lax.rsqrt(mean_square + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def log_softmax(z: jax.Array) -> jax.Array:
    """float32 log-softmax over the last axis with the normaliser summed by `tree_sum`."""
    z = z.astype(jnp.float32)
    shifted = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    return shifted - jnp.log(tree_sum(jnp.exp(shifted), -1))[..., None]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(hd)) v with KV-head sharing, every sum by `tree_sum`, in float32.

    q [B, T, Hq, hd], k/v [B, S, Hkv, hd], visible [B, T, S] -> [B, T, Hq, hd] in q's dtype.
    Keys must sit at slot = position for the result to match between a decode step and the
    full forward (masked slots after the visible ones add exact zeros). A query with no visible
    key gets zeros."""
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    group = heads // kv_heads
    q32 = q.astype(jnp.float32).reshape(batch, length, kv_heads, group, 1, head_dim)
    k32 = k.astype(jnp.float32).transpose(0, 2, 1, 3)[:, None, :, None]  # [B, 1, Hkv, 1, S, hd]
    v32 = v.astype(jnp.float32).transpose(0, 2, 1, 3)[:, None, :, None]
    scores = tree_sum(q32 * k32, -1) * (head_dim ** -0.5)  # [B, T, Hkv, G, S]
    mask = visible[:, :, None, None, :]
    scores = jnp.where(mask, scores, -jnp.inf)
    top = jnp.max(scores, axis=-1, keepdims=True)
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    weights = jnp.where(mask, jnp.exp(scores - top), 0.0)
    total = tree_sum(weights, -1)[..., None]
    out = tree_sum(weights[..., None] * v32, -2) / jnp.where(total > 0, total, 1.0)
    return out.reshape(batch, length, heads, head_dim).astype(q.dtype)
