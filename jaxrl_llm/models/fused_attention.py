"""Causal self-attention through cuDNN's fused (flash-style) kernel on NVIDIA GPUs.

XLA's own attention writes every [T, S] score matrix to memory and reads it back for the
softmax and the backward pass; the fused kernel keeps them in on-chip memory, block by block
(FlashAttention, Dao et al. 2022, arXiv 2205.14135; cuDNN's implementation of it). Measured on
one H200 (``python -m jaxrl_llm.benchmarks.model --torch-device cuda``, SmolLM2-135M bf16
forward+backward): with XLA's attention 2x2048 ran at 0.88x of PyTorch's (which uses a fused
kernel through scaled_dot_product_attention), 8x512 at 1.83x; with this kernel 3.61x and 3.52x.
One layer's attention forward+backward at 2x2048 (``python -m jaxrl_llm.benchmarks.fused_attention``)
took 1.299 ms with XLA and 0.621 ms with cuDNN, gradients as close to a float32 reference as XLA's
bf16 ones; the Qwen2.5-1.5B-shaped learner step at 8 x 2048 went from 15.2k to 19.2k tokens/s.

cuDNN takes bf16/fp16 inputs with a head size of at most 128 (a multiple of 8); float32 and CPUs
keep XLA's path. A boolean mask reaches the kernel as an additive bias of a large negative
number, so the softmax of a row with no visible key is left to rounding (in float16 the bias
plus a score can overflow to -inf, and the row to NaN), and the backward pass sums every row's
terms into the keys' gradients. Such rows are padding (nothing reads their outputs);
``with_own_key`` gives each of them exactly one key, its own, so every softmax is well defined
and every other row's result stays as it was. ``JAXRL_LLM_CUDNN_ATTENTION=0`` turns the fused
path off.
"""
from __future__ import annotations

import os
from collections.abc import Mapping

import jax
import jax.numpy as jnp

ENV_SWITCH = "JAXRL_LLM_CUDNN_ATTENTION"
FUSED_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
MAX_HEAD_DIM = 128


def use_cudnn_attention(dtype, head_dim: int, backend: str | None = None,
                        environ: Mapping[str, str] | None = None) -> bool:
    """Whether causal self-attention of this dtype and head size runs through cuDNN: on a GPU, in
    bf16/fp16, head size <= 128 and a multiple of 8, unless ``JAXRL_LLM_CUDNN_ATTENTION=0``."""
    environ = os.environ if environ is None else environ
    backend = jax.default_backend() if backend is None else backend
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
