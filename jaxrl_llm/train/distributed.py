"""Multi-host JAX: one entry point for one process or many, and a global mesh.

The same command runs on a laptop, a GPU node, a SLURM allocation and a TPU
pod; `initialize_from_env()` reads where it is from the environment and calls
`jax.distributed.initialize` only when there is more than one process:

  * explicit (any launcher): JAXRL_COORDINATOR_ADDRESS=host:port,
    JAXRL_NUM_PROCESSES=N, JAXRL_PROCESS_ID=i (JAXRL_LOCAL_DEVICE_IDS=0,1
    optionally pins the local accelerators);
  * SLURM (srun, one task per process): SLURM_NTASKS, SLURM_PROCID and the
    first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST as coordinator, on
    port JAXRL_COORDINATOR_PORT (default 12355);
  * Cloud TPU VMs (TPU_WORKER_HOSTNAMES with more than one host, or
    JAXRL_DISTRIBUTED=tpu): JAX detects everything itself, so
    `jax.distributed.initialize()` is called without arguments;
  * nothing of the above, or one process: no-op.

After initialisation `jax.devices()` lists the devices of every process;
`global_mesh` builds the ("data", "fsdp", "tensor") mesh over all of them after
checking that the axis sizes multiply to the device count, and
`global_batch` turns each process's rows into one global array (every process
holds only its own rows, as with per-host data loading).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Mapping

import jax
import numpy as np

from jaxrl_llm.models import batch_sharding, make_mesh

DEFAULT_SLURM_PORT = 12355
_initialized: "DistributedEnv | None" = None
_barriers = 0


@dataclasses.dataclass(frozen=True)
class DistributedEnv:
    """Where this process stands. `source` is "single", "explicit", "slurm" or "tpu"."""

    source: str
    num_processes: int
    process_id: int
    coordinator_address: str | None = None
    local_device_ids: tuple[int, ...] | None = None

    @property
    def is_multi_process(self) -> bool:
        return self.num_processes > 1


def _int_var(env: Mapping[str, str], name: str) -> int:
    text = env[name]
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"environment variable {name}={text!r} is not an integer") from None


def first_slurm_host(nodelist: str) -> str:
    """First host name of a SLURM node list: 'gpu[012-015,020],cpu1' -> 'gpu012'.
    (The same answer as `scontrol show hostnames | head -1`, without calling scontrol.)"""
    match = re.match(r"^([^,\[]+)(\[([^\]]+)\])?", nodelist.strip())
    if not match or not match.group(1):
        raise ValueError(f"cannot read a host from SLURM node list {nodelist!r}")
    prefix, ranges = match.group(1), match.group(3)
    if ranges is None:
        return prefix
    first = ranges.split(",")[0].split("-")[0]
    return prefix + first


def detect_distributed_env(env: Mapping[str, str] | None = None) -> DistributedEnv:
    """Reads the process layout from environment variables (see the module docstring).
    Explicit JAXRL_* variables win over SLURM, SLURM over TPU."""
    env = os.environ if env is None else env
    if "JAXRL_NUM_PROCESSES" in env or "JAXRL_COORDINATOR_ADDRESS" in env:
        missing = [k for k in ("JAXRL_COORDINATOR_ADDRESS", "JAXRL_NUM_PROCESSES", "JAXRL_PROCESS_ID") if k not in env]
        if missing:
            raise ValueError(f"multi-process JAX needs JAXRL_COORDINATOR_ADDRESS, JAXRL_NUM_PROCESSES and "
                             f"JAXRL_PROCESS_ID together; missing: {', '.join(missing)}")
        num, pid = _int_var(env, "JAXRL_NUM_PROCESSES"), _int_var(env, "JAXRL_PROCESS_ID")
        address = env["JAXRL_COORDINATOR_ADDRESS"]
        local = env.get("JAXRL_LOCAL_DEVICE_IDS")
        local_ids = tuple(int(x) for x in local.split(",") if x.strip()) if local else None
        return _checked(DistributedEnv("explicit", num, pid, address, local_ids))
    if "SLURM_NTASKS" in env and "SLURM_PROCID" in env and "SLURM_JOB_ID" in env:
        num, pid = _int_var(env, "SLURM_NTASKS"), _int_var(env, "SLURM_PROCID")
        if num == 1:
            return DistributedEnv("single", 1, 0)
        nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
        if not nodelist:
            raise ValueError("SLURM_NTASKS > 1 but neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST is set")
        port = _int_var(env, "JAXRL_COORDINATOR_PORT") if "JAXRL_COORDINATOR_PORT" in env else DEFAULT_SLURM_PORT
        return _checked(DistributedEnv("slurm", num, pid, f"{first_slurm_host(nodelist)}:{port}"))
    hosts = [h for h in env.get("TPU_WORKER_HOSTNAMES", "").split(",") if h.strip()]
    if env.get("JAXRL_DISTRIBUTED") == "tpu" or len(hosts) > 1:
        worker = int(env.get("TPU_WORKER_ID", env.get("CLOUD_TPU_TASK_ID", "0")))
        return DistributedEnv("tpu", max(len(hosts), 1), worker)
    return DistributedEnv("single", 1, 0)


def _checked(d: DistributedEnv) -> DistributedEnv:
    if d.num_processes < 1:
        raise ValueError(f"number of processes {d.num_processes} must be >= 1")
    if not 0 <= d.process_id < d.num_processes:
        raise ValueError(f"process id {d.process_id} must be in 0..{d.num_processes - 1} "
                         f"(num_processes={d.num_processes})")
    if d.coordinator_address is not None and not re.match(r"^[^:\s]+:\d+$", d.coordinator_address):
        raise ValueError(f"coordinator address {d.coordinator_address!r} must look like host:port")
    return d


def initialize_from_env(env: Mapping[str, str] | None = None, *, timeout_s: int = 300) -> DistributedEnv:
    """Calls `jax.distributed.initialize` as the environment describes; a no-op for one
    process and on a second call. Must run before the first JAX computation."""
    global _initialized
    if _initialized is not None:
        return _initialized
    found = detect_distributed_env(env)
    if found.source == "tpu":
        jax.distributed.initialize(initialization_timeout=timeout_s)
        found = dataclasses.replace(found, num_processes=jax.process_count(), process_id=jax.process_index())
    elif found.is_multi_process:
        jax.distributed.initialize(coordinator_address=found.coordinator_address,
                                   num_processes=found.num_processes, process_id=found.process_id,
                                   local_device_ids=list(found.local_device_ids) if found.local_device_ids else None,
                                   initialization_timeout=timeout_s)
    _initialized = found
    return found


# ----------------------------------------------------------------------- mesh
def resolve_mesh_axes(data: int, fsdp: int, tensor: int, device_count: int | None = None) -> dict[str, int]:
    """Axis sizes with the one -1 filled in; raises ValueError unless data * fsdp * tensor
    equals the device count (of all processes), naming the axes and the count."""
    count = jax.device_count() if device_count is None else int(device_count)
    sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
    for name, size in sizes.items():
        if not isinstance(size, (int, np.integer)) or isinstance(size, bool) or (size < 1 and size != -1):
            raise ValueError(f"mesh.{name}={size!r} is invalid; valid: a positive int, or -1 on one axis "
                             f"for 'all remaining devices'")
    inferred = [name for name, size in sizes.items() if size == -1]
    if len(inferred) > 1:
        raise ValueError(f"mesh axes {inferred} are all -1; at most one axis may be inferred")
    known = int(np.prod([size for size in sizes.values() if size != -1]))
    if inferred:
        if count % known:
            fixed = " x ".join(f"mesh.{k}={v}" for k, v in sizes.items() if v != -1)
            raise ValueError(f"{fixed} = {known} does not divide the {count} devices ({jax.process_count()} "
                             f"process(es)), so mesh.{inferred[0]}=-1 cannot be inferred; valid: sizes whose product "
                             f"divides {count}, e.g. the default mesh.data=1 mesh.fsdp=-1 mesh.tensor=1")
        sizes[inferred[0]] = count // known
    total = int(np.prod(list(sizes.values())))
    if total != count:
        raise ValueError(f"mesh data={sizes['data']} x fsdp={sizes['fsdp']} x tensor={sizes['tensor']} = {total}, "
                         f"but there are {count} devices ({jax.process_count()} process(es)); "
                         f"valid: sizes whose product is {count}, e.g. data=-1")
    return {k: int(v) for k, v in sizes.items()}


def learner_mesh(mesh_cfg: Any) -> jax.sharding.Mesh | None:
    """The learner's mesh of a config's `mesh` section: None on one device (no sharding), but the
    sizes are checked against the device count there too (ConfigError naming the axis), so a
    config asking for more devices than exist is refused instead of run on another mesh."""
    from jaxrl_llm.utils.typed_config import ConfigError

    try:
        axes = resolve_mesh_axes(mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return make_mesh(**axes) if jax.device_count() > 1 else None


def rollout_mesh(mesh_cfg: Any) -> jax.sharding.Mesh | None:
    """The JAX sampler's own ("data", "tensor") mesh of a config's `rollout.mesh` section over this process's
    devices (`rollout.sampler_mesh`); None when unset (the sampler decodes in the layout handed to it).
    Sizes the devices cannot hold: ConfigError naming rollout.mesh and what is valid."""
    from jaxrl_llm.rollout.sampler_mesh import sampler_mesh
    from jaxrl_llm.utils.typed_config import ConfigError

    if not mesh_cfg.enabled:
        return None
    try:
        return sampler_mesh(*mesh_cfg.sizes())
    except ValueError as err:
        raise ConfigError(f"rollout.mesh: {err}") from None


def global_mesh(mesh_cfg: Any = None, *, data: int = -1, fsdp: int = 1, tensor: int = 1) -> jax.sharding.Mesh:
    """Mesh over the devices of every process, from a MeshConfig (or explicit sizes)."""
    if mesh_cfg is not None:
        data, fsdp, tensor = mesh_cfg.data, mesh_cfg.fsdp, mesh_cfg.tensor
    return make_mesh(**resolve_mesh_axes(data, fsdp, tensor))


# ---------------------------------------------------------------------- batch
def process_row_slice(mesh: jax.sharding.Mesh, num_rows: int) -> slice:
    """The rows of a [num_rows, ...] batch (split over ("data", "fsdp")) that this
    process's devices hold: the rows it must load or sample itself."""
    sharding = batch_sharding(mesh, 1)
    indices = sharding.addressable_devices_indices_map((num_rows,))
    starts = sorted({(idx[0].start or 0, idx[0].stop if idx[0].stop is not None else num_rows)
                     for idx in indices.values()})
    lo, hi = starts[0][0], starts[-1][1]
    if sum(b - a for a, b in starts) != hi - lo:
        raise ValueError(f"this process's rows of the mesh {dict(mesh.shape)} are not contiguous: {starts}")
    return slice(lo, hi)


def global_batch(mesh: jax.sharding.Mesh, local_tree: Any, num_rows: int) -> Any:
    """Each leaf: this process's rows [process_row_slice] -> a global [num_rows, ...] array
    split over ("data", "fsdp") (`jax.make_array_from_process_local_data`)."""
    def one(x):
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(batch_sharding(mesh, x.ndim), x, (num_rows, *x.shape[1:]))
    return jax.tree.map(one, local_tree)


def gather_to_host(tree: Any) -> Any:
    """Every leaf as a full numpy array on every process (collective: all processes call it)."""
    if jax.process_count() == 1:
        return jax.tree.map(np.asarray, jax.device_get(tree))
    from jax.experimental import multihost_utils

    barrier("gather_to_host")
    return jax.tree.map(np.asarray, multihost_utils.process_allgather(tree, tiled=True))


def barrier(name: str, *, timeout_s: float = 1800.0) -> None:
    """Waits until every process reaches `name` (no-op for one process). Cross-process
    collectives on CPU (gloo) give up after 30 s, so processes whose work differs in
    length (sampling different prompts, compiling) meet here first."""
    if jax.process_count() == 1:
        return
    from jax._src import distributed as _jax_distributed  # the coordination-service client

    global _barriers
    client = _jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("several JAX processes but no distributed client: call initialize_from_env() first")
    _barriers += 1  # every process passes its barriers in the same order: the ids match
    client.wait_at_barrier(f"jaxrl_{name}_{_barriers}", int(timeout_s * 1000))


def warm_up_collectives() -> None:
    """Sets up the cross-process communicator (gloo on CPU) while all processes are lined up:
    its set-up gives up after 30 s, so it must not happen inside the first jitted step, where
    one process may still be compiling. No-op for one process."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    barrier("warm_up_collectives")
    multihost_utils.process_allgather(np.zeros(1, np.float32), tiled=True)


# ------------------------------------------------------------------ rollouts
def process_prompt_block(num_prompts: int) -> slice:
    """The prompts of a step this process samples: an equal contiguous share per process."""
    count, index = jax.process_count(), jax.process_index()
    if num_prompts % count:
        raise ValueError(f"rollout.prompts_per_step={num_prompts} is not a multiple of the {count} JAX processes; "
                         f"valid: a multiple of {count} (each process samples an equal share)")
    share = num_prompts // count
    return slice(index * share, (index + 1) * share)


def allgather_rollouts(rollouts, rewards: np.ndarray, counts: np.ndarray, *, prompt_width: int,
                       completion_width: int):
    """Every process's (RolloutBatch, rewards [P_i, G], counts [k]) as one step batch on
    every process, in process order: the rollouts and rewards concatenated, the counts
    summed (collective: all processes call it). The records travel as fixed-width arrays,
    prompts right-padded to `prompt_width`, completions to `completion_width`, the routing
    records (MoE; routing replay) to prompt_width + completion_width - 1 rows, -1 after their end."""
    from jax.experimental import multihost_utils

    from jaxrl_llm.rollout.types import RolloutBatch

    barrier("allgather_rollouts")
    mine = np.array([_routing_shape(rollouts.records)], np.int64)  # every process must build the same arrays
    shape = tuple(int(x) for x in np.asarray(multihost_utils.process_allgather(mine, tiled=True)).max(axis=0))
    arrays = _record_arrays(rollouts.records, prompt_width, completion_width, shape if shape[0] else None)
    arrays.update(rewards=np.asarray(rewards, np.float32), counts=np.asarray(counts, np.int64)[None])
    full = jax.tree.map(np.asarray, multihost_utils.process_allgather(arrays, tiled=True))
    merged = _records_from_arrays(full, rollouts.samples_per_prompt)
    n = rollouts.samples_per_prompt
    return RolloutBatch(merged, len(merged) // n, n), full["rewards"], full["counts"].sum(axis=0)


def _routing_shape(records) -> tuple[int, int]:
    """(num_layers, top_k) of the records' routed_experts; (0, 0) when none has one."""
    return next((tuple(r.routed_experts.shape[1:]) for r in records if r.routed_experts is not None), (0, 0))


def _record_arrays(records, prompt_width: int, completion_width: int, routing_shape) -> dict[str, np.ndarray]:
    """The records as fixed-width arrays (`allgather_rollouts`); ``routing_shape`` (nL, k) or None."""
    rows = len(records)
    arrays = {"prompt": np.zeros((rows, prompt_width), np.int32), "prompt_len": np.zeros(rows, np.int32),
              "completion": np.zeros((rows, completion_width), np.int32), "length": np.zeros(rows, np.int32),
              "logp": np.zeros((rows, completion_width), np.float32), "stop": np.zeros(rows, bool),
              "loss_mask": np.zeros((rows, completion_width), np.float32), "version": np.zeros(rows, np.int32)}
    if routing_shape is not None:
        arrays["routing"] = np.full((rows, prompt_width + completion_width - 1, *routing_shape), -1, np.int32)
        arrays["has_routing"] = np.zeros(rows, bool)
    for i, r in enumerate(records):
        p, c = r.prompt_token_ids.size, r.num_completion_tokens
        arrays["prompt"][i, :p], arrays["prompt_len"][i] = r.prompt_token_ids, p
        arrays["completion"][i, :c], arrays["logp"][i, :c], arrays["length"][i] = (
            r.completion_token_ids, r.sampler_logprobs, c)
        arrays["loss_mask"][i, :c] = r.policy_mask  # multi-turn episodes: 0 on observation tokens
        arrays["stop"][i], arrays["version"][i] = r.finish_reason == "stop", r.weight_version
        if r.routed_experts is not None:
            arrays["routing"][i, :len(r.routed_experts)], arrays["has_routing"][i] = r.routed_experts, True
    return arrays


def _records_from_arrays(full: Mapping[str, np.ndarray], samples_per_prompt: int) -> tuple:
    """The RolloutRecords of `_record_arrays`' (gathered) arrays, prompt-major with ``samples_per_prompt`` per prompt."""
    from jaxrl_llm.rollout.types import RolloutRecord

    n = samples_per_prompt

    def routing(i, length):
        if "routing" not in full or not full["has_routing"][i]:
            return None
        return full["routing"][i, :full["prompt_len"][i] + length - 1]

    def record(i):
        length = full["length"][i]
        return RolloutRecord(
            prompt_index=i // n, sample_index=i % n, prompt_token_ids=full["prompt"][i, :full["prompt_len"][i]],
            completion_token_ids=full["completion"][i, :length], sampler_logprobs=full["logp"][i, :length],
            finish_reason="stop" if full["stop"][i] else "length", weight_version=int(full["version"][i]),
            loss_mask=full["loss_mask"][i, :length], routed_experts=routing(i, length))

    return tuple(record(i) for i in range(full["prompt"].shape[0]))
