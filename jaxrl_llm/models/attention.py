"""The decoder's attention: softmax(q k^T / sqrt(hd)) v with KV-head sharing, the learner's causal
attention in query blocks (or cuDNN's fused kernel on NVIDIA GPUs), and a decode step's attention
over the filled windows of the KV cache. Used by :mod:`jaxrl_llm.models.decoder`, which re-exports
every name here.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models.fused_attention import (SegmentSpans, cudnn_causal_attention, cudnn_segment_attention,
                                              use_cudnn_attention)
from jaxrl_llm.models.platform import target_platform


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(hd)) v with KV-head sharing, through ``jax.nn.dot_product_attention``.

    q [B, T, Hq, hd], k/v [B, S, Hkv, hd], visible [B, T, S] bool -> [B, T, Hq, hd].
    Scores and softmax in float32 (bf16/fp16 inputs accumulate in float32). The KV heads
    are shared by groups of Hq / Hkv query heads without copying them (JAX lowers
    this through XLA; its cuDNN kernel takes no arbitrary mask). A row with no visible key gets
    uniform weights: finite, and only ever at padded positions. float16 on CPU runs in
    float32 (XLA:CPU has no float16 x float16 -> float32 dot).
    """
    dtype = q.dtype
    if dtype == jnp.float16 and target_platform() == "cpu":
        q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
    out = jax.nn.dot_product_attention(q, k, v, mask=visible[:, None], scale=q.shape[-1] ** -0.5)
    return out.astype(dtype)


# Causal attention in query blocks (``causal_attention``): at most this many blocks, of at least
# this many rows. Skipping the blocks above the diagonal roughly halves the attention's work at
# long T; blocks of 128 and 256 rows measured alike (docs/benchmarks.md, CPU learner).
ATTENTION_BLOCKS = 8
MIN_ATTENTION_BLOCK = 128


def attention_block_size(length: int) -> int:
    """Query rows per block of ``causal_attention`` for a sequence of ``length`` tokens."""
    return max(MIN_ATTENTION_BLOCK, -(-length // ATTENTION_BLOCKS))


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """``grouped_attention`` for keys at the queries' own positions (k/v [B, T, Hkv, hd], no cache)
    under a mask that is at least causal (``visible[b, t, s]`` False for s > t), one block of
    query rows at a time: the block of rows [start, end) attends to keys [0, end) only, so the
    scores above the diagonal's blocks are neither computed nor stored (what flash-attention
    kernels skip; Dao et al. 2022, arXiv 2205.14135). Same values as one call at every row with
    a visible key; a row with none (padding) gets uniform weights over its block's keys instead
    of all keys. On NVIDIA GPUs in bf16/fp16 one cuDNN fused call replaces the blocks
    (``models.fused_attention``); packed rows given as ``SegmentSpans`` take cuDNN's
    segment-aware call with no mask at all."""
    fused = use_cudnn_attention(q.dtype, q.shape[-1])  # NVIDIA GPUs, bf16/fp16: one fused kernel
    if isinstance(visible, SegmentSpans):
        if fused:
            return cudnn_segment_attention(q, k, v, visible)
        visible = visible.visible
    if fused:
        return cudnn_causal_attention(q, k, v, visible)
    length = q.shape[1]
    block = attention_block_size(length)
    if length <= block:
        return grouped_attention(q, k, v, visible)
    blocks = [(start, min(start + block, length)) for start in range(0, length, block)]
    return jnp.concatenate([grouped_attention(q[:, start:end], k[:, :end], v[:, :end], visible[:, start:end, :end])
                            for start, end in blocks], axis=1)


def cache_window_sizes(max_len: int, window: int) -> tuple[int, ...]:
    """Cache prefixes a windowed decode step can attend over: window, 2 window, ..., max_len."""
    if window <= 0:
        raise ValueError(f"cache_window must be a positive number of slots, got {window}")
    return tuple(min(max_len, (i + 1) * window) for i in range(-(-max_len // window)))


def windowed_cache_attention(q: jax.Array, kv: dict, layer_index: jax.Array, visible: jax.Array,
                             filled: jax.Array, window: int) -> jax.Array:
    """`grouped_attention` of q [B, T, Hq, hd] over layer ``layer_index`` of the cache
    kv {"k", "v": [nL, B, S, Hkv, hd]}, reading only the first n * ``window`` slots, n the
    fewest windows holding the ``filled`` slots written so far (`lax.switch` over the
    prefix sizes). Slots at or past ``filled`` are invisible anyway, so the result is the
    full-cache attention's, at a cost growing with the filled length instead of S."""
    _, batch, max_len, heads, head_dim = kv["k"].shape
    sizes = cache_window_sizes(max_len, window)

    def attend(size: int):
        def branch(q, kv, layer_index, visible):
            start = (layer_index, 0, 0, 0, 0)
            k = jax.lax.dynamic_slice(kv["k"], start, (1, batch, size, heads, head_dim))[0].astype(q.dtype)
            v = jax.lax.dynamic_slice(kv["v"], start, (1, batch, size, heads, head_dim))[0].astype(q.dtype)
            return grouped_attention(q, k, v, visible[:, :, :size])
        return branch

    index = jnp.clip((filled - 1) // window, 0, len(sizes) - 1)
    return jax.lax.switch(index, [attend(size) for size in sizes], q, kv, layer_index, visible)


def shared_slot_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv: dict, layer_index: jax.Array,
                          visible: jax.Array, write_at: jax.Array, window: int | None) -> tuple[dict, jax.Array]:
    """Write k/v [B, T, Hkv, hd] at slots write_at.. (the same for every row) of layer ``layer_index``
    of kv {"k", "v": [nL, B, S, Hkv, hd]}, then attend q [B, T, Hq, hd] over that layer's cache under
    ``visible`` [B, T, S]: over its filled windows (`windowed_cache_attention`) or, with ``window``
    None, all S slots -> (kv, attended [B, T, Hq, hd])."""
    start = (layer_index, 0, write_at, 0, 0)
    kv = {"k": jax.lax.dynamic_update_slice(kv["k"], k[None].astype(kv["k"].dtype), start),
          "v": jax.lax.dynamic_update_slice(kv["v"], v[None].astype(kv["v"].dtype), start)}
    if window is not None:
        return kv, windowed_cache_attention(q, kv, layer_index, visible, write_at + q.shape[1], window)
    layer_k = jax.lax.dynamic_index_in_dim(kv["k"], layer_index, keepdims=False).astype(q.dtype)
    layer_v = jax.lax.dynamic_index_in_dim(kv["v"], layer_index, keepdims=False).astype(q.dtype)
    return kv, grouped_attention(q, layer_k, layer_v, visible)
