"""Where the learner's arrays live: `Placement`, built once from the learner's mesh.

Without a mesh (one device) every array is a plain JAX array. With a mesh ("data", "fsdp",
"tensor"; `models.sharding`), possibly spanning several JAX processes:

* weights (the policy's, LoRA's frozen base, the reference copy, the teacher) follow
  `models.param_shardings`; LoRA's small adapters are replicated;
* each optimiser moment takes its parameter's sharding; optimiser counts and the learner's
  scalars are replicated;
* a step batch's rows, and a row plan's micro-batch rows, are split over ("data", "fsdp");
  the plan's read-back indices are replicated;
* host arrays that meet the learner's (the sampler's log-probs, the mask) are replicated.

Every placement goes through `put_global`, a `jax.device_put` that also serves meshes over
several processes. The Learner and its side passes hold one `Placement` and ask it, so the
learner's code reads the same on one device and on a mesh.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm.models import batch_sharding, param_shardings
from jaxrl_llm.models.sharding import BATCH_AXES
from jaxrl_llm.train.distributed import gather_to_host
from jaxrl_llm.train.learn.micro_batch import DeviceRows
from jaxrl_llm.train.learn.packing import RowPlan


class Placement:
    """The learner's mesh (None: one device, nothing sharded) and how each kind of array sits on it."""

    def __init__(self, mesh: jax.sharding.Mesh | None):
        self.mesh = mesh
        self._replicated = None if mesh is None else jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    @property
    def data_parallel(self) -> int:
        """How many ways the batch rows are split: the product of the mesh's ("data", "fsdp") sizes."""
        return 1 if self.mesh is None else int(np.prod([self.mesh.shape[a] for a in BATCH_AXES]))

    def params(self, params):
        """Full-size weights (the policy's, LoRA's frozen base, a reference or teacher copy) by
        `models.param_shardings`; unchanged without a mesh."""
        return params if self.mesh is None else put_global(params, param_shardings(params, self.mesh))

    def train_state(self, optimizer: optax.GradientTransformation, params, others, *, replicate_params: bool):
        """A fresh learner state on the mesh: (params, `optimizer.init` of them, `others`). The params
        follow `param_shardings` (`replicate_params`: replicated, LoRA's adapters), each optimiser
        moment its parameter; the optimiser's other leaves (step counts) and `others` are replicated.
        Without a mesh only the optimiser state is made."""
        if self.mesh is None:
            return params, optimizer.init(params), others
        if replicate_params:
            shardings = jax.tree.map(lambda _: self._replicated, params)
        else:
            shardings = param_shardings(params, self.mesh)
        params = put_global(params, shardings)
        opt_state = optax.tree_utils.tree_map_params(
            optimizer, put_global, optimizer.init(params), shardings,
            transform_non_params=lambda x: put_global(x, self._replicated))
        return params, opt_state, put_global(others, self._replicated)

    def rows(self, plan: RowPlan) -> DeviceRows:
        """A row plan on the devices: its per-micro-batch rows [k, R, W] (and routing records
        [k, R, W, nL, top_k]) split over the batch axes, the head slots, flags and read-back indices replicated."""
        per_micro = (plan.tokens, plan.segment_ids, plan.positions)
        rest = (plan.head_slots, plan.used, plan.completion_index, plan.micro_batch)
        if self.mesh is None:
            return DeviceRows(*map(jnp.asarray, per_micro + rest), routing=jax.tree.map(jnp.asarray, plan.routing))
        split = jax.sharding.NamedSharding(self.mesh, jax.sharding.PartitionSpec(None, BATCH_AXES, None))
        return DeviceRows(*put_global(per_micro, split), *put_global(rest, self._replicated),
                          routing=put_global(plan.routing, split))

    def batch(self, tree):
        """Every leaf's leading (row) axis split over the batch axes (a step batch)."""
        if self.mesh is None:
            return jax.tree.map(jnp.asarray, tree)
        return jax.tree.map(lambda x: put_global(x, batch_sharding(self.mesh, np.ndim(x))), tree)

    def replicated(self, x) -> jax.Array:
        """A host array as a JAX array that can meet the learner's arrays in one computation:
        plain with one process; with several, replicated over the global mesh."""
        if jax.process_count() == 1 or self.mesh is None:
            return jnp.asarray(x)
        return put_global(x, self._replicated)

    def replicated_inside(self, tree):
        """Inside a jitted function: every leaf constrained to be replicated (each device runs the
        single-device program on all of it); unchanged without a mesh."""
        if self.mesh is None:
            return tree
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, self._replicated), tree)

    def host(self, tree: Any):
        """`tree` with every leaf readable on this host: when a leaf is spread over several processes'
        devices, the whole tree gathered (a collective: every process calls it); otherwise as it is."""
        if any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree.leaves(tree)):
            return gather_to_host(tree)
        return tree


def put_global(tree, shardings):
    """jax.device_put that also works with several JAX processes: there a sharding spans
    other processes' devices and JAX places only host values (identical on every process)
    or arrays already spread over the mesh, so process-local arrays go through the host."""
    if jax.process_count() == 1:
        return jax.device_put(tree, shardings)

    def one(x, sharding):
        if isinstance(x, jax.Array) and not x.is_fully_addressable:
            return jax.device_put(x, sharding)  # already global: a reshard
        host = np.asarray(x)  # each process fills its own devices' shards, no cross-process check
        return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

    if isinstance(shardings, jax.sharding.Sharding):
        return jax.tree.map(lambda x: one(x, shardings), tree)
    return jax.tree.map(one, tree, shardings)
