"""Causal self-attention through cuDNN's fused (flash-style) kernel on NVIDIA GPUs.

XLA's own attention writes every [T, S] score matrix to memory and reads it back for the
softmax and the backward pass; the fused kernel keeps them in on-chip memory, block by block
(FlashAttention, Dao et al. 2022, arXiv 2205.14135; cuDNN's implementation of it). At long T the
score matrices are what makes XLA's bf16 attention slower than PyTorch's fused
scaled_dot_product_attention; with this kernel the gradients stay as close to a float32 reference
as XLA's bf16 ones. ``make gpu-check``'s attention check compares the two paths; the measurements
are in docs/benchmarks.md (learner on GPUs).

cuDNN takes bf16/fp16 inputs with a head size of at most 128 (a multiple of 8); float32 and CPUs
keep XLA's path. A boolean mask reaches the kernel as an additive bias of a large negative
number, so the softmax of a row with no visible key is left to rounding (in float16 the bias
plus a score can overflow to -inf, and the row to NaN), and the backward pass sums every row's
terms into the keys' gradients. Such rows are padding (nothing reads their outputs);
``with_own_key`` gives each of them exactly one key, its own, so every softmax is well defined
and every other row's result stays as it was. ``JAXRL_LLM_CUDNN_ATTENTION=0`` turns the fused
path off.

Packed rows (several sequences back to back, ``segment_ids``) need no mask at all: cuDNN takes
each row's segments as (start offset, length) pairs and applies the causal mask inside each
segment (its ragged "padding causal" mode), so no [B, 1, T, T] mask is built, no bias is added
and no bias gradient is computed in the backward pass. ``SegmentSpans`` carries those pairs
(``segment_spans`` derives them from segment ids); ``cudnn_segment_attention`` makes the call
through JAX's cuDNN binding (``jax._src.cudnn.fused_attention_stablehlo``: the public
``jax.nn.dot_product_attention`` takes one length per row, not several segments).
``JAXRL_LLM_CUDNN_SEGMENTS=0`` keeps packed rows on the mask path.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.platform import target_platform

ENV_SWITCH = "JAXRL_LLM_CUDNN_ATTENTION"
SEGMENTS_SWITCH = "JAXRL_LLM_CUDNN_SEGMENTS"
FUSED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_HEAD_DIM = 128


def use_cudnn_attention(dtype, head_dim: int, backend: str | None = None,
                        environ: Mapping[str, str] | None = None) -> bool:
    """Whether causal self-attention of this dtype and head size runs through cuDNN: on a GPU, in
    bf16/fp16, head size <= 128 and a multiple of 8, unless ``JAXRL_LLM_CUDNN_ATTENTION=0``."""
    environ = os.environ if environ is None else environ
    backend = target_platform() if backend is None else backend
    return (backend == "gpu" and environ.get(ENV_SWITCH, "1") != "0" and jnp.dtype(dtype) in FUSED_DTYPES
            and head_dim <= MAX_HEAD_DIM and head_dim % 8 == 0)


def with_own_key(visible: jax.Array) -> jax.Array:
    """visible [B, T, T] with every query also seeing the key at its own position."""
    return visible | jnp.eye(visible.shape[1], visible.shape[2], dtype=bool)[None]


def cudnn_causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(hd)) v for q [B, T, Hq, hd], k/v [B, T, Hkv, hd] (Hkv divides Hq) under
    ``visible`` [B, T, T], a mask that is at least causal, in one cuDNN call (causal blocks skipped)."""
    return jax.nn.dot_product_attention(q, k, v, mask=with_own_key(visible)[:, None], scale=q.shape[-1] ** -0.5,
                                        is_causal=True, implementation="cudnn")


class SegmentSpans(NamedTuple):
    """Packed rows as cuDNN takes them, plus the dense mask for every other path."""

    visible: jax.Array  # bool [B, T, T]: causal within equal non-zero segment ids
    lengths: jax.Array  # int32 [B, M + 1]: tokens of the row's m-th segment (the padding run last), -1 after
    offsets: jax.Array  # int32 [B, M + 2]: slot where the m-th segment starts, -1 where none
    real: jax.Array  # bool [B, T]: slot holds a token (segment id > 0)


def segment_spans(segment_ids: jax.Array, visible: jax.Array, max_segments: int) -> SegmentSpans:
    """The spans of rows holding segments 1, 2, ..., K back to back from slot 0 and padding (id 0)
    after them (the learner's packed rows, `train.packing`), K <= max_segments. The padding run is
    given to cuDNN as one more segment, so every slot belongs to a segment (its outputs are zeroed
    afterwards): left outside every segment, cuDNN's backward pass returned NaN key and value
    gradients there (H100, jax 0.11.2)."""
    ids = jnp.arange(1, max_segments + 1, dtype=segment_ids.dtype)
    member = segment_ids[:, :, None] == ids[None, None, :]  # [B, T, M]
    lengths = member.sum(1).astype(jnp.int32)
    starts = jnp.argmax(member, axis=1).astype(jnp.int32)
    count = (lengths > 0).sum(1, keepdims=True)  # K per row
    filled = lengths.sum(1, keepdims=True)
    padding = segment_ids.shape[1] - filled
    slot = jnp.arange(max_segments + 1)[None, :]
    real_lengths = jnp.pad(lengths, ((0, 0), (0, 1)))
    real_starts = jnp.pad(starts, ((0, 0), (0, 1)))
    is_padding = (slot == count) & (padding > 0)
    lengths = jnp.where(slot < count, real_lengths, jnp.where(is_padding, padding, -1)).astype(jnp.int32)
    offsets = jnp.where(slot < count, real_starts, jnp.where(is_padding, filled, -1)).astype(jnp.int32)
    offsets = jnp.concatenate([offsets, jnp.full_like(offsets[:, :1], -1)], axis=1)
    return SegmentSpans(visible, lengths, offsets, segment_ids > 0)


def use_cudnn_segments(environ: Mapping[str, str] | None = None) -> bool:
    """Whether packed rows take the segment-aware cuDNN call (unless ``JAXRL_LLM_CUDNN_SEGMENTS=0``)."""
    environ = os.environ if environ is None else environ
    return environ.get(SEGMENTS_SWITCH, "1") != "0"


def cudnn_segment_attention(q: jax.Array, k: jax.Array, v: jax.Array, spans: SegmentSpans) -> jax.Array:
    """Causal attention within each segment of packed rows, q [B, T, Hq, hd], k/v [B, T, Hkv, hd],
    in one cuDNN call without a mask; slots outside every segment get 0."""
    from jax._src.cudnn.fused_attention_stablehlo import MaskType, dot_product_attention

    out = dot_product_attention(q, k, v, q_seqlen=spans.lengths, kv_seqlen=spans.lengths, q_offsets=spans.offsets,
                                kv_offsets=spans.offsets, scale=q.shape[-1] ** -0.5,
                                mask_type=MaskType.PADDING_CAUSAL, qkv_layout="BTNH")
    return jnp.where(spans.real[:, :, None, None], out, jnp.zeros((), out.dtype))
