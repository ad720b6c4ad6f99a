"""The learner's performance levers as the benchmarks switch them: the attention path of packed
rows, the remat mode and the LM head's options (`models.logprobs.HeadOptions`).

The attention path and the head's options are read from the environment when a step is traced
(`models.fused_attention.use_cudnn_attention` / `use_cudnn_segments`, `models.logprobs.head_options`),
so `switched(...)` sets those variables around the construction and first call of a step and puts
the previous values back afterwards. Paths:

  cudnn_segments  cuDNN's fused attention reading each packed row's segment spans (no mask; the
                  learner's default on NVIDIA GPUs in bf16);
  cudnn_mask      cuDNN's fused attention with the dense [B, T, T] segment mask;
  xla             XLA's attention in query blocks (`models.attention.causal_attention`; the only path
                  on CPUs and TPUs).
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping

import jax
import jax.numpy as jnp

from jaxrl_llm.models.fused_attention import ENV_SWITCH, SEGMENTS_SWITCH, use_cudnn_attention
from jaxrl_llm.models.logprobs import HEAD_CHUNK_SWITCH, HEAD_LOGITS_SWITCH, HEAD_MATMUL_SWITCH, HeadOptions
from jaxrl_llm.models.remat import REMAT_MODES

ATTENTION_PATHS = {"cudnn_segments": {ENV_SWITCH: "1", SEGMENTS_SWITCH: "1"},
                   "cudnn_mask": {ENV_SWITCH: "1", SEGMENTS_SWITCH: "0"},
                   "xla": {ENV_SWITCH: "0"}}


def attention_unavailable(path: str, head_dim: int, backend: str | None = None) -> str | None:
    """Why ``path`` cannot run on this backend (None: it can); ValueError for an unknown path."""
    if path not in ATTENTION_PATHS:
        raise ValueError(f"attention path {path!r} is unknown; valid: {', '.join(ATTENTION_PATHS)}")
    if path == "xla":
        return None
    backend = jax.default_backend() if backend is None else backend
    if not use_cudnn_attention(jnp.bfloat16, head_dim, backend=backend, environ={}):
        return f"no cuDNN attention on backend {backend!r} (NVIDIA GPUs, bf16, head_dim {head_dim})"
    return None


def default_attention_path(head_dim: int, backend: str | None = None) -> str:
    """The path the learner takes with no switch set."""
    return "cudnn_segments" if attention_unavailable("cudnn_segments", head_dim, backend) is None else "xla"


def head_environment(options: HeadOptions) -> dict[str, str]:
    """The variables that make `models.logprobs.head_options()` return ``options``. Not validated here:
    `head_options` checks them when a step is traced (a bad value fails that step, not its caller)."""
    return {HEAD_CHUNK_SWITCH: str(options.chunk_size), HEAD_LOGITS_SWITCH: options.logits_dtype,
            HEAD_MATMUL_SWITCH: options.matmul_dtype}


def lever_environment(attention: str | None = None, head: HeadOptions | None = None) -> dict[str, str]:
    """The variables of an attention path (None: the learner's default) and head options (None: defaults)."""
    env: dict[str, str] = {}
    if attention is not None:
        attention_unavailable(attention, 128)  # validates the name
        env.update(ATTENTION_PATHS[attention])
    env.update(head_environment(HeadOptions() if head is None else head))
    return env


def check_remat(mode: str) -> str:
    if mode not in REMAT_MODES:
        raise ValueError(f"remat={mode!r} is invalid for a lever; valid: {', '.join(REMAT_MODES)}")
    return mode


@contextlib.contextmanager
def switched(env: Mapping[str, str], environ=None) -> Iterator[None]:
    """``env`` set in ``environ`` (default os.environ) inside the block; the old values (or absence) after."""
    environ = os.environ if environ is None else environ
    before = {key: environ.get(key) for key in env}
    environ.update(env)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                environ.pop(key, None)
            else:
                environ[key] = value
