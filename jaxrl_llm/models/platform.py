"""The platform a program is built for: the target devices', not the process's default backend.

Choices that depend on the hardware (the layer loop's form, fused attention kernels, Pallas'
interpreter, the learner's XLA:CPU options, the sampler's decode path) ask `target_platform()`.
It is ``jax.default_backend()`` unless a caller compiling for other devices says otherwise with
``compiling_for(platform)``: an ahead-of-time compile for a TPU topology on a CPU-only machine
(`jaxrl compile`) traces with the local backend "cpu", but the program it builds runs on "tpu".
`mesh_platform(mesh)` names the platform of a mesh's devices ("cpu", "gpu", "tpu").
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("jaxrl_target_platform", default=None)


def target_platform() -> str:
    """The platform being compiled for: the innermost ``compiling_for``, else JAX's default backend."""
    return _TARGET.get() or jax.default_backend()


@contextlib.contextmanager
def compiling_for(platform: str | None) -> Iterator[None]:
    """Within the block, `target_platform()` is ``platform`` (None: unchanged)."""
    if platform is None:
        yield
        return
    token = _TARGET.set(str(platform))
    try:
        yield
    finally:
        _TARGET.reset(token)


def mesh_platform(mesh: jax.sharding.Mesh | None) -> str:
    """The platform of a mesh's devices; `target_platform()` without a mesh."""
    return target_platform() if mesh is None else str(mesh.devices.flat[0].platform)
