"""A decode step's attention over a KV cache whose rows are filled to different lengths.

The slot decode (`jaxrl_llm.rollout.decode_slots`) keeps each row's tokens at cache slots
0, 1, ..., its own length - 1 (no left padding), so row b's visible keys are exactly the
prefix [0, lengths[b]) and a new token is written at its own slot ``lengths[b]``
(`write_rows`: a scatter at a per-row index). The attention of one query per row over
such a prefix has three implementations, picked by name (``DECODE_KERNELS``):

* ``"dense"``: `attention.grouped_attention` over the whole cache under the mask
  slot < length (XLA; every backend). The reference the others are tested against.
* ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` with
  ``key_value_seq_lengths`` = the row lengths (cuDNN's fused kernel, NVIDIA GPUs,
  bf16/fp16 only). Not run in this repository's CPU tests: unverified until a GPU sweep.
* ``"pallas"``: JAX's Pallas split-K decode kernel
  (``jax.experimental.pallas.ops.gpu.decode_attention.gqa``, with ``kv_seq_len`` = the row
  lengths; Triton on NVIDIA GPUs). On CPU it runs in Pallas' interpreter (``interpret``),
  which is how the tests check its numbers; its speed on a GPU is unmeasured here.

``"auto"`` resolves to ``"dense"`` on every backend until a GPU sweep
(`benchmarks.gpu.gpu_sampler.sampler_sweep`) has measured the fused kernels: nothing is called
fused that has not been run.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.models.attention import grouped_attention
from jaxrl_llm.models.platform import target_platform

DECODE_KERNELS = ("auto", "dense", "cudnn", "pallas")


def resolve_decode_kernel(name: str, backend: str | None = None) -> str:
    """The kernel ``name`` stands for on ``backend`` (default: JAX's): "auto" -> "dense" (see module doc)."""
    if name not in DECODE_KERNELS:
        raise ValueError(f"decode attention kernel {name!r} is not one of {DECODE_KERNELS}")
    return "dense" if name == "auto" else name


CACHE_MULTIPLE = 16  # the slot decode's cache length is a multiple of this (the Pallas kernel's blocks)


def pallas_blocks(length: int) -> tuple[int, int]:
    """(k_splits, block_k) of the Pallas decode kernel for a cache of ``length`` slots: the most
    splits (<= 16) leaving whole blocks of >= 16 slots, the largest block (<= 128) dividing a split."""
    if length % CACHE_MULTIPLE:
        raise ValueError(f"the Pallas decode kernel needs a cache length that is a multiple of {CACHE_MULTIPLE}, "
                         f"got {length}")
    splits = next(k for k in (16, 8, 4, 2, 1) if length % (k * 16) == 0)
    return splits, next(b for b in (128, 64, 32, 16) if (length // splits) % b == 0)


def write_rows(cache: jax.Array, layer_index: jax.Array, new: jax.Array, slots: jax.Array) -> jax.Array:
    """cache [nL, B, S, H, hd] with new [B, T, H, hd] written at layer ``layer_index``, row b's
    token t at slot ``slots[b, t]`` (a slot >= S is dropped: rows that write nothing)."""
    def write_row(row_cache, row_new, row_slots):  # [nL, S, H, hd], [T, H, hd], [T]
        return row_cache.at[layer_index, row_slots].set(row_new.astype(cache.dtype), mode="drop")

    return jax.vmap(write_row, in_axes=(1, 0, 0), out_axes=1)(cache, new, slots)


def prefix_attention(q: jax.Array, k: jax.Array, v: jax.Array, lengths: jax.Array, kernel: str) -> jax.Array:
    """softmax(q k^T / sqrt(hd)) v of one query per row, q [B, 1, Hq, hd], over row b's keys
    k/v [B, S, Hkv, hd] at slots [0, lengths[b]) -> [B, 1, Hq, hd] (``kernel``: module doc).
    A row needs lengths >= 1; rows nothing reads may hold any length in [1, S]."""
    if kernel == "dense":
        visible = jnp.arange(k.shape[1])[None, None, :] < lengths[:, None, None]
        return grouped_attention(q, k, v, visible)
    if kernel == "cudnn":
        return jax.nn.dot_product_attention(q, k, v, scale=q.shape[-1] ** -0.5,
                                            query_seq_lengths=jnp.ones_like(lengths),
                                            key_value_seq_lengths=lengths, implementation="cudnn")
    if kernel == "pallas":
        from jax.experimental.pallas.ops.gpu import decode_attention as pallas_decode

        splits, block = pallas_blocks(k.shape[1])
        out = pallas_decode.gqa(q[:, 0], k, v, kv_seq_len=lengths, sm_scale=q.shape[-1] ** -0.5, k_splits=splits,
                                block_k=block, interpret=target_platform() == "cpu")
        return out[:, None].astype(q.dtype)
    raise ValueError(f"decode attention kernel {kernel!r} is not one of {DECODE_KERNELS[1:]} (resolve 'auto' first)")


def slot_cache_attention(q: jax.Array, k: jax.Array, v: jax.Array, kv: dict, layer_index: jax.Array,
                         slots: jax.Array, kernel: str) -> tuple[dict, jax.Array]:
    """One decode token per row: write k/v [B, 1, Hkv, hd] at each row's slot ``slots`` [B, 1] of
    layer ``layer_index`` of kv {"k", "v": [nL, B, S, Hkv, hd]}, then attend q [B, 1, Hq, hd] over
    the row's slots [0, slot] -> (kv, attended [B, 1, Hq, hd]). A row with slot >= S writes nothing."""
    kv = {"k": write_rows(kv["k"], layer_index, k, slots), "v": write_rows(kv["v"], layer_index, v, slots)}
    layer_k = jax.lax.dynamic_index_in_dim(kv["k"], layer_index, keepdims=False).astype(q.dtype)
    layer_v = jax.lax.dynamic_index_in_dim(kv["v"], layer_index, keepdims=False).astype(q.dtype)
    lengths = jnp.clip(slots[:, -1] + 1, 1, layer_k.shape[1])
    return kv, prefix_attention(q, layer_k, layer_v, lengths, kernel)
