"""XLA compiler options for the learner's jitted step (per executable, not process-wide).

On CPU, jaxlib 0.10 hands individual matmuls to YNNPACK by default; letting it fuse each
matmul with the elementwise work around it (``xla_cpu_experimental_ynn_fusion_type =
LIBRARY_FUSION_TYPE_DOT``) removes part of the layout copies around the float32 backward's
weight-gradient matmuls, with gradients equal to the default build's up to float32 rounding. In
bfloat16 it gained little and moved the gradients by the size of bf16 rounding, so it is used for
float32 compute only. The comparison (``benchmarks.xla_flags``, removed in issue 33, in git
history) is in docs/benchmarks.md.

The option is passed as ``jax.jit(..., compiler_options=...)``, so it touches only the
learner's executables, never the sampler's or a user's, and needs no environment variable
set before JAX starts. It is left out when the user's ``XLA_FLAGS`` already names the
option, when ``JAXRL_LLM_XLA_CPU_OPTIONS=0``, on other backends, and on jaxlib versions it
was not measured on (another version may not know the option).
"""
from __future__ import annotations

import os
from importlib import metadata
from typing import Any

YNN_FUSION = "xla_cpu_experimental_ynn_fusion_type"
FLOAT32_CPU_OPTIONS = {YNN_FUSION: "LIBRARY_FUSION_TYPE_DOT"}
MEASURED_JAXLIB = ((0, 10),)  # (major, minor) versions whose XLA:CPU knows and gained from the option


def _jaxlib_minor() -> tuple[int, int] | None:
    try:
        major, minor = metadata.version("jaxlib").split(".")[:2]
        return int(major), int(minor)
    except (metadata.PackageNotFoundError, ValueError):
        return None


def learner_compiler_options(compute_dtype: Any, backend: str, *, environ=None,
                             jaxlib_minor: tuple[int, int] | None = None) -> dict[str, Any] | None:
    """Compiler options for the learner's jitted functions, or None for XLA's defaults.

    ``compute_dtype``: the dtype of the params and matmuls (a name or numpy dtype);
    ``backend``: ``jax.default_backend()``; ``environ`` defaults to ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    jaxlib_minor = _jaxlib_minor() if jaxlib_minor is None else jaxlib_minor
    if (backend != "cpu" or str(compute_dtype) != "float32" or jaxlib_minor not in MEASURED_JAXLIB
            or environ.get("JAXRL_LLM_XLA_CPU_OPTIONS", "1") == "0"
            or YNN_FUSION in environ.get("XLA_FLAGS", "")):
        return None
    return dict(FLOAT32_CPU_OPTIONS)
