"""Sharding rules for a ("data", "fsdp", "tensor") device mesh.

* "data": pure data parallelism (params replicated across it).
* "fsdp": batch AND parameter sharding (ZeRO-3 style; Rajbhandari et al. 2020):
  each matrix's model dimension D is split over it and gathered per use.
* "tensor": Megatron-style tensor parallelism (Shoeybi et al. 2019): heads
  and FFN columns of q/k/v/gate/up, rows of o/down, and the vocabulary.

Batch arrays are split over ("data", "fsdp") on their first axis. A dimension
that does not divide its mesh axis is left unsplit (replicated) rather than
rejected, so odd tiny configs still run; norms are always replicated.
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")

# Leaf name -> mesh axis per array dimension (layer leaves include the leading layer axis).
_PARAM_RULES: dict[str, tuple[str | None, ...]] = {
    "embed": ("tensor", "fsdp"),          # [V, D]
    "lm_head": ("fsdp", "tensor"),        # [D, V]
    "final_norm": (None,),
    "input_norm": (None, None),
    "post_norm": (None, None),
    "q_norm": (None, None),
    "k_norm": (None, None),
    "q_proj": (None, "fsdp", "tensor"),   # [nL, D, heads*hd]
    "k_proj": (None, "fsdp", "tensor"),
    "v_proj": (None, "fsdp", "tensor"),
    "o_proj": (None, "tensor", "fsdp"),   # [nL, heads*hd, D]
    "q_bias": (None, "tensor"),
    "k_bias": (None, "tensor"),
    "v_bias": (None, "tensor"),
    "o_bias": (None, None),
    "gate_proj": (None, "fsdp", "tensor"),  # [nL, D, F]
    "up_proj": (None, "fsdp", "tensor"),
    "down_proj": (None, "tensor", "fsdp"),  # [nL, F, D]
    # Mixture of experts (models.moe): experts split over "fsdp" (expert parallelism), each
    # expert's SwiGLU width over "tensor"; the small router is replicated.
    "router": (None, None, None),                   # [nL, D, E]
    "expert_gate": (None, "fsdp", None, "tensor"),  # [nL, E, D, F]
    "expert_up": (None, "fsdp", None, "tensor"),
    "expert_down": (None, "fsdp", "tensor", None),  # [nL, E, F, D]
}


def make_mesh(data: int = 1, fsdp: int = 1, tensor: int = 1, *, devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh of shape (data, fsdp, tensor) over ``devices`` (default: all of ``jax.devices()``).

    One size may be -1: it takes whatever the device count leaves. The product must equal the
    device count. Tensor is the innermost (fastest-varying) axis so its collectives stay on
    neighbouring devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, int) or (size <= 0 and size != -1):
            raise ValueError(f"mesh axis {name}={size!r} must be a positive int (or -1 to infer)")
    inferred = [name for name, size in sizes.items() if size == -1]
    if len(inferred) > 1:
        raise ValueError(f"only one mesh axis may be -1, got {inferred}")
    known = int(np.prod([size for size in sizes.values() if size != -1]))
    if inferred:
        if len(devices) % known:
            raise ValueError(f"{len(devices)} devices cannot be split into {sizes} ({known} does not divide it)")
        sizes[inferred[0]] = len(devices) // known
    total = sizes["data"] * sizes["fsdp"] * sizes["tensor"]
    if total != len(devices):
        raise ValueError(f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} x tensor={sizes['tensor']} = {total} "
                         f"devices, but {len(devices)} are available; the product must equal the device count")
    grid = np.asarray(devices, dtype=object).reshape(sizes["data"], sizes["fsdp"], sizes["tensor"])
    return Mesh(grid, MESH_AXES)


def _fit(spec: Sequence[str | None], shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    """Drop the mesh axis of every dimension it does not divide evenly."""
    return PartitionSpec(*[axis if axis is not None and dim % mesh.shape[axis] == 0 else None
                           for axis, dim in zip(spec, shape)])


def _leaf_name(path) -> str:
    last = path[-1]
    return str(getattr(last, "key", getattr(last, "name", last)))


def param_partition_specs(params_or_shapes: Any, mesh: Mesh,
                          rules: dict[str, tuple[str | None, ...]] | None = None) -> Any:
    """PartitionSpec per leaf of a params pytree (arrays or ShapeDtypeStructs), from ``rules``
    (leaf name -> mesh axis per dimension; default: the learner's, above)."""
    rules = _PARAM_RULES if rules is None else rules

    def spec_for(path, leaf):
        name = _leaf_name(path)
        if name not in rules:
            raise ValueError(f"no sharding rule for parameter {jax.tree_util.keystr(path)}; "
                             f"known names: {sorted(rules)}")
        rule = rules[name]
        if len(rule) != len(leaf.shape):
            raise ValueError(f"parameter {jax.tree_util.keystr(path)} has shape {leaf.shape}, "
                             f"expected rank {len(rule)}")
        return _fit(rule, leaf.shape, mesh)

    return jax.tree_util.tree_map_with_path(spec_for, params_or_shapes)


def param_shardings(params_or_shapes: Any, mesh: Mesh, rules: dict[str, tuple[str | None, ...]] | None = None) -> Any:
    """NamedSharding per leaf of a params pytree (arrays or ShapeDtypeStructs); ``rules`` as in
    `param_partition_specs`."""
    specs = param_partition_specs(params_or_shapes, mesh, rules)
    return jax.tree_util.tree_map(lambda spec: NamedSharding(mesh, spec), specs,
                                  is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Leading (batch) axis split over ("data", "fsdp"); other axes replicated."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *([None] * (ndim - 1))))


def cache_shardings(cache: dict, mesh: Mesh) -> dict:
    """KV cache: batch over ("data", "fsdp"), KV heads over "tensor" when they divide it."""
    kv_heads = cache["k"].shape[3]
    head_axis = "tensor" if kv_heads % mesh.shape["tensor"] == 0 else None
    kv = NamedSharding(mesh, PartitionSpec(None, BATCH_AXES, None, head_axis, None))
    return {"k": kv, "v": kv, "mask": batch_sharding(mesh, 2), "end": NamedSharding(mesh, PartitionSpec()),
            "next_pos": batch_sharding(mesh, 1)}
