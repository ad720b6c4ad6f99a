"""The JAX sampler's own device mesh ("data", "tensor") and the layout of its weights and KV cache on it.

The learner keeps its weights in the layout a gradient step wants (`models.sharding`: every matrix
split over "fsdp" and gathered where it is used). A decode step from that layout gathers every
weight of the model to compute a few hundred tokens. The sampler therefore has a mesh of its own
(`rollout.mesh`), and a layout on it in which a decode step gathers no weight:

* "tensor": Megatron-style tensor parallelism (Shoeybi et al. 2019). q/k/v, gate and up are split
  by output columns (attention heads, MLP hidden units: column-parallel), o and down by input rows
  (row-parallel), so each device computes its heads and hidden units from its own slice and one
  all-reduce of the [rows, D] activations per o and per down sums the slices. The embedding and the
  LM head are split over the vocabulary. Norms and the MoE router are replicated.
* "data": the rows (the compacting decode's batch, the slot decode's slots) and their KV cache;
  weights are replicated over it.

Grouped-query attention (`SamplerLayout.plan`). Each device needs the KV heads of its q heads. When
"tensor" divides the KV heads, they are split with their q heads. When it does not (Qwen2.5-1.5B
has 2 KV heads; tensor 4), each KV head is stored r = lcm(Hkv, tensor) / Hkv times, as vLLM and
MaxText replicate KV heads, so the sampler runs a model of Hkv * r KV heads with the same numbers
(q head i reads copy i // (Hq / (Hkv r)) of KV head i // (Hq / Hkv)). That needs the q heads to
split too (Hq a multiple of lcm(Hkv, tensor)); where they do not, attention is replicated over
"tensor" (every device computes all heads from whole q/k/v/o matrices) and only the MLP and the
vocabulary are split: more compute per device, still no weight gathered. Any other dimension that
"tensor" does not divide (MLP width, vocabulary) is likewise left whole.

The slot decode splits the KV cache by slots instead, where the heads would need copies or stay whole
(``split_slots``; `SamplerLayout.plan` with ``decode="slots"``): each device keeps every KV head of
1/tensor of each row's slots, so the cache is stored and read once (with copies, r times: at batch 256,
Qwen2.5-1.5B's cache outweighs its weights). The attention weights split by columns as above, whatever
the head boundaries (q, k, v by output, o by input); XLA gathers the step's q/k/v activations over
"tensor" (a few hundred KB per layer), each device scores its own slots, and the softmax's max and sum
and the weighted values are reduced over "tensor" (the split-K of flash decoding, across devices).
The compacting decode writes every row at one shared position of a slot-split cache, which XLA
partitions by gathering the cache, so it keeps the heads plan.

The hand-off (`SamplerLayout.placer`): one jitted copy (KV heads repeated where the plan says)
from whatever layout the params arrive in (the learner's FSDP shards, host arrays) to the
sampler's shardings. `JaxSampler` runs it once per weight version (`update_weights`); its decode
steps read the placed copy, so no decode step moves a weight between devices.
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxrl_llm.models import DecoderConfig, param_shardings

SAMPLER_AXES = ("data", "tensor")
_KV_LEAVES = ("k_proj", "v_proj", "k_bias", "v_bias")  # last dimension: KV heads x head_dim


def sampler_mesh(data: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """Mesh ("data", "tensor") over ``devices`` (default: this process's, ``jax.local_devices()``: each
    process's sampler decodes its own rows from its own copy of the weights). One size may be -1: the
    devices the other leaves. The product must equal the device count; "tensor" is the inner axis, so
    its all-reduces stay between neighbouring devices."""
    devices = list(jax.local_devices() if devices is None else devices)
    sizes = {"data": data, "tensor": tensor}
    bad = [f"{k}={v!r}" for k, v in sizes.items()
           if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or (v < 1 and v != -1)]
    if bad or data == tensor == -1:
        raise ValueError(f"sampler mesh {', '.join(bad) or 'data=-1, tensor=-1'} is invalid; valid: positive ints, "
                         f"or -1 on one axis for the devices the other leaves")
    count, known = len(devices), abs(data * tensor)
    if -1 in sizes.values():
        if count % known:
            raise ValueError(f"sampler mesh data={data} x tensor={tensor}: {known} does not divide the {count} "
                             f"devices; valid: a divisor of {count}")
        sizes = {k: (count // known if v == -1 else v) for k, v in sizes.items()}
    if sizes["data"] * sizes["tensor"] != count:
        raise ValueError(f"sampler mesh data={sizes['data']} x tensor={sizes['tensor']} = "
                         f"{sizes['data'] * sizes['tensor']} devices, but this process has {count}; "
                         f"valid: sizes whose product is {count}, e.g. data=-1 tensor=1")
    grid = np.asarray(devices, dtype=object).reshape(sizes["data"], sizes["tensor"])
    return Mesh(grid, SAMPLER_AXES)


def sampler_rules(split_heads: bool) -> dict[str, tuple[str | None, ...]]:
    """Leaf name -> mesh axis per dimension (layer leaves lead with the layer axis); the module doc's
    Megatron layout. ``split_heads`` False: attention replicated over "tensor"."""
    heads = "tensor" if split_heads else None
    column, row = (None, None, heads), (None, heads, None)
    return {
        "embed": ("tensor", None), "lm_head": (None, "tensor"),  # [V, D], [D, V]: the vocabulary
        "final_norm": (None,), "input_norm": (None, None), "post_norm": (None, None),
        "q_norm": (None, None), "k_norm": (None, None),
        "q_proj": column, "k_proj": column, "v_proj": column, "o_proj": row,
        "q_bias": (None, heads), "k_bias": (None, heads), "v_bias": (None, heads), "o_bias": (None, None),
        "gate_proj": (None, None, "tensor"), "up_proj": (None, None, "tensor"), "down_proj": (None, "tensor", None),
        "router": (None, None, None),  # [nL, D, E]; experts [nL, E, D, F] / [nL, E, F, D]: F over "tensor"
        "expert_gate": (None, None, None, "tensor"), "expert_up": (None, None, None, "tensor"),
        "expert_down": (None, None, "tensor", None),
    }


def repeat_kv_heads(params: dict, num_kv_heads: int, head_dim: int, repeat: int) -> dict:
    """``params`` with each KV head of k/v (weights and biases) stored ``repeat`` times in a row:
    head h becomes heads h*repeat .. h*repeat + repeat - 1 (the plan's GQA replication)."""
    if repeat == 1:
        return params

    def stretch(w):
        heads = w.reshape(*w.shape[:-1], num_kv_heads, head_dim)
        return jax.numpy.repeat(heads, repeat, axis=-2).reshape(*w.shape[:-1], num_kv_heads * repeat * head_dim)

    layers = {name: stretch(w) if name in _KV_LEAVES else w for name, w in params["layers"].items()}
    return dict(params, layers=layers)


def _fit(mesh: Mesh, shape: Sequence[int], spec: Sequence[str | None]) -> NamedSharding:
    """``spec`` without the axes that do not divide their dimension (those dimensions stay whole)."""
    return NamedSharding(mesh, PartitionSpec(*[a if a is not None and d % mesh.shape[a] == 0 else None
                                               for a, d in zip(spec, shape)]))


@dataclasses.dataclass(frozen=True)
class SamplerLayout:
    """How the sampler's model sits on its mesh (hashable: a static argument of the decode programs).
    ``kv_repeat``: copies of each KV head; ``split_heads``: attention heads over "tensor"; ``split_slots``:
    the KV cache's slots over "tensor", the attention weights split by columns (module doc)."""

    mesh: Mesh
    kv_repeat: int = 1
    split_heads: bool = True
    split_slots: bool = False

    @classmethod
    def plan(cls, cfg: DecoderConfig, mesh: Mesh, decode: str = "compact") -> "SamplerLayout":
        """The layout of ``cfg`` on ``mesh`` for the ``decode`` path ("compact" or "slots"; module doc):
        heads split with their KV heads when "tensor" divides those; else for the slot decode the cache
        split by slots; else KV heads repeated up to lcm(Hkv, tensor) when the q heads split into that
        many groups; attention replicated otherwise."""
        if tuple(mesh.axis_names) != SAMPLER_AXES:
            raise ValueError(f"the sampler's mesh needs axes {SAMPLER_AXES}, got {tuple(mesh.axis_names)}")
        if decode not in ("compact", "slots"):
            raise ValueError(f"decode path {decode!r} is not one of ('compact', 'slots')")
        tensor = mesh.shape["tensor"]
        group = math.lcm(cfg.num_kv_heads, tensor)
        if decode == "slots" and tensor > 1 and group != cfg.num_kv_heads:
            return cls(mesh, 1, False, True)
        if cfg.num_heads % group:
            return cls(mesh, 1, False)
        return cls(mesh, group // cfg.num_kv_heads, True)

    def model_config(self, cfg: DecoderConfig) -> DecoderConfig:
        """The config the sampler decodes with: ``cfg`` with each KV head counted ``kv_repeat`` times."""
        return dataclasses.replace(cfg, num_kv_heads=cfg.num_kv_heads * self.kv_repeat)

    def param_shardings(self, params_or_shapes: Any) -> Any:
        """NamedSharding per leaf of params in the sampler's model (`model_config`; KV heads repeated)."""
        return param_shardings(params_or_shapes, self.mesh, sampler_rules(self.split_heads or self.split_slots))

    def placer(self, cfg: DecoderConfig, params_or_shapes: Any) -> Callable[[Any], Any]:
        """The hand-off: a jitted function taking params of ``cfg`` in any layout (as ``params_or_shapes``)
        to the sampler's model on its mesh (KV heads repeated, `param_shardings`). Bitwise copies only."""
        repeat = functools.partial(repeat_kv_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
                                   repeat=self.kv_repeat)
        return jax.jit(repeat, out_shardings=self.param_shardings(jax.eval_shape(repeat, params_or_shapes)))

    def rows_sharding(self, shape: Sequence[int], axis: int = 0) -> NamedSharding:
        """Dimension ``axis`` (rows) of an array of ``shape`` split over "data", the rest replicated."""
        spec = [None] * len(shape)
        spec[axis] = "data"
        return _fit(self.mesh, shape, spec)

    def cache_sharding(self, shape: Sequence[int], split_rows: bool = True) -> NamedSharding:
        """A KV cache [nL, rows, slots, Hkv, hd]: rows over "data" (``split_rows``; else on every device, as
        the prompts' cache that any slot may copy from), slots or KV heads over "tensor" (when split)."""
        spec = (None, "data" if split_rows else None, "tensor" if self.split_slots else None,
                "tensor" if self.split_heads else None, None)
        return _fit(self.mesh, shape, spec)

    def rows(self, x: jax.Array, axis: int = 0) -> jax.Array:
        """``x`` laid out by `rows_sharding` (inside jit)."""
        return jax.lax.with_sharding_constraint(x, self.rows_sharding(x.shape, axis))

    def cache(self, kv: jax.Array, split_rows: bool = True) -> jax.Array:
        """``kv`` laid out by `cache_sharding` (inside jit)."""
        return jax.lax.with_sharding_constraint(kv, self.cache_sharding(kv.shape, split_rows))
