"""Multi-host JAX on one machine: 2 processes x 2 CPU devices, jax.distributed over
127.0.0.1, a global (fsdp=2, tensor=2) mesh, each process loading only its own rows.
Two learner steps must give the parameters of a single-process, unsharded run on the
same global batch. Also: environment detection and mesh validation errors.

Run as a script (`python -m tests.train.test_distributed --worker OUT`) this module is
one of the worker processes."""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PROMPTS, G, WIDTH = 4, 4, 8
MESH = dict(data=1, fsdp=2, tensor=2)


# ------------------------------------------------------------ shared set-up
def tiny_setup():
    """(learner kwargs, params, seq, rewards, sampler_logp): all a pure function of fixed seeds."""
    import jax

    from jaxrl_llm import core
    from jaxrl_llm.models import DecoderConfig, init_params
    from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord
    from jaxrl_llm.train.learn.batch import build_sequences
    from jaxrl_llm.train.config import TrainConfig

    cfg = DecoderConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=4, max_position_embeddings=64)
    params = jax.device_get(init_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(7)
    records = []
    for p in range(PROMPTS):
        prompt = rng.integers(1, 64, size=int(rng.integers(2, 6)))
        for j in range(G):
            length = int(rng.integers(1, WIDTH + 1))
            records.append(RolloutRecord(p, j, prompt, rng.integers(1, 64, size=length),
                                         -rng.uniform(1.0, 5.0, size=length), "stop", 0))
    seq = build_sequences(RolloutBatch(tuple(records), PROMPTS, G), completion_width=WIDTH, prompt_bucket=8)
    rewards = rng.integers(0, 2, size=(PROMPTS, G)).astype(np.float32)
    # adam_eps=1e-5, not 1e-8: Adam's m / (sqrt(v) + eps) amplifies the ~1e-7 relative
    # difference of sharded vs unsharded gradient sums ~1000x on near-cancelling entries
    # (measured: 1.9e-6 with eps 1e-8, 4e-8 with eps 1e-5 after two steps).
    train_cfg = dataclasses.replace(TrainConfig(), precision="fp32", lr=1e-3, micro_batch_size=4, adam_eps=1e-5)
    kwargs = dict(model_cfg=cfg, recipe=core.get_recipe("olmo3"), train_cfg=train_cfg, total_steps=10)
    return kwargs, params, seq, rewards


def step_batch(learner, params, seq, rewards):
    """pi_old from an unsharded learner (identical on every process), sampler logprobs
    from the records, then the recipe's StepBatch (token TIS correction) as numpy."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm import core

    old_logp, _ = learner.logprobs(params, seq)
    batch, _ = core.prepare_step_batch(learner.recipe, core.StepInputs(jnp.asarray(rewards),
                                                                       jnp.asarray(seq.completion_mask), old_logp,
                                                                       jnp.asarray(seq.sampler_logp)))
    return jax.tree.map(np.asarray, jax.device_get(batch))


def flat(tree) -> dict[str, np.ndarray]:
    import jax

    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def worker(out: str) -> None:
    import jax

    from jaxrl_llm.train import distributed
    from jaxrl_llm.train.learn.learner import Learner

    env = distributed.initialize_from_env()
    assert env.num_processes == 2 and jax.process_count() == 2 and jax.device_count() == 4
    kwargs, params, seq, rewards = tiny_setup()
    batch = step_batch(Learner(**kwargs), params, seq, rewards)
    mesh = distributed.global_mesh(**MESH)
    learner = Learner(**kwargs, mesh=mesh)
    rows = distributed.process_row_slice(mesh, seq.tokens.shape[0])
    local = lambda tree: jax.tree.map(lambda x: np.asarray(x)[rows], tree)  # noqa: E731
    n = seq.tokens.shape[0]
    arrays = distributed.global_batch(mesh, local((seq.tokens, seq.attention_mask, seq.positions)), n)
    global_seq = seq._replace(tokens=arrays[0], attention_mask=arrays[1], positions=arrays[2])
    global_step = distributed.global_batch(mesh, local(batch), n)
    state = learner.init(params)
    for _ in range(2):
        state, _ = learner.update(state, global_seq, global_step)
    gathered = distributed.gather_to_host(state.params)
    if jax.process_index() == 0:
        np.savez(out, rows_start=rows.start, rows_stop=rows.stop, **flat(gathered))
    else:
        np.savez(out + ".p1.npz", rows_start=rows.start, rows_stop=rows.stop)


# -------------------------------------------------------------------- tests
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(600)  # two jax.distributed processes, each allowed 500 s
def test_two_processes_equal_one_process(tmp_path):
    port = _free_port()
    out = str(tmp_path / "params.npz")
    procs = []
    for pid in range(2):
        env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu",
                   JAXRL_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAXRL_NUM_PROCESSES="2", JAXRL_PROCESS_ID=str(pid),
                   PYTHONPATH=str(ROOT))
        procs.append(subprocess.Popen([sys.executable, "-m", "tests.train.test_distributed", "--worker", out],
                                      cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = [p.communicate(timeout=500)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]

    import jax

    from jaxrl_llm.train.learn.learner import Learner

    kwargs, params, seq, rewards = tiny_setup()
    learner = Learner(**kwargs)  # one process, one device, no mesh
    batch = step_batch(learner, params, seq, rewards)
    state = learner.init(params)
    for _ in range(2):
        state, _ = learner.update(state, seq, _as_step_batch(batch))
    expected = flat(jax.device_get(state.params))
    got = np.load(out)
    # fsdp=2 spans the processes: process 0 holds rows 0..7, process 1 rows 8..15.
    assert (int(got["rows_start"]), int(got["rows_stop"])) == (0, 8)
    p1 = np.load(out + ".p1.npz")
    assert (int(p1["rows_start"]), int(p1["rows_stop"])) == (8, 16)
    initial = flat(params)
    for name, value in expected.items():
        assert not np.allclose(value, initial[name]), f"{name} did not move: the check would be vacuous"
        np.testing.assert_allclose(got[name], value, rtol=0, atol=1e-6, err_msg=name)


def _as_step_batch(batch):
    import jax.numpy as jnp

    return type(batch)(*[None if x is None else jnp.asarray(x) for x in batch])


def test_detect_env_explicit_slurm_tpu_single():
    from jaxrl_llm.train.distributed import detect_distributed_env, first_slurm_host

    d = detect_distributed_env({"JAXRL_COORDINATOR_ADDRESS": "10.0.0.1:1234", "JAXRL_NUM_PROCESSES": "4",
                                "JAXRL_PROCESS_ID": "3", "JAXRL_LOCAL_DEVICE_IDS": "0,1"})
    assert (d.source, d.num_processes, d.process_id, d.coordinator_address, d.local_device_ids) == \
        ("explicit", 4, 3, "10.0.0.1:1234", (0, 1))
    slurm = {"SLURM_JOB_ID": "77", "SLURM_NTASKS": "8", "SLURM_PROCID": "5",
             "SLURM_STEP_NODELIST": "gpu[012-015,020],cpu1"}
    d = detect_distributed_env(slurm)
    assert (d.source, d.num_processes, d.process_id, d.coordinator_address) == ("slurm", 8, 5, "gpu012:12355")
    d = detect_distributed_env({**slurm, "JAXRL_COORDINATOR_PORT": "999"})
    assert d.coordinator_address == "gpu012:999"
    assert first_slurm_host("node7") == "node7"
    assert first_slurm_host("a-b[3,5-9]") == "a-b3"
    d = detect_distributed_env({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3", "TPU_WORKER_ID": "2"})
    assert (d.source, d.num_processes, d.process_id) == ("tpu", 4, 2)
    assert detect_distributed_env({}).source == "single"
    assert detect_distributed_env({"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}).source == "single"


def test_detect_env_errors_name_the_bad_value():
    from jaxrl_llm.train.distributed import detect_distributed_env

    with pytest.raises(ValueError, match="missing: JAXRL_PROCESS_ID"):
        detect_distributed_env({"JAXRL_COORDINATOR_ADDRESS": "h:1", "JAXRL_NUM_PROCESSES": "2"})
    with pytest.raises(ValueError, match=r"process id 2 must be in 0\.\.1"):
        detect_distributed_env({"JAXRL_COORDINATOR_ADDRESS": "h:1", "JAXRL_NUM_PROCESSES": "2", "JAXRL_PROCESS_ID": "2"})
    with pytest.raises(ValueError, match="'hostonly' must look like host:port"):
        detect_distributed_env({"JAXRL_COORDINATOR_ADDRESS": "hostonly", "JAXRL_NUM_PROCESSES": "2",
                                "JAXRL_PROCESS_ID": "0"})
    with pytest.raises(ValueError, match="JAXRL_NUM_PROCESSES='two' is not an integer"):
        detect_distributed_env({"JAXRL_COORDINATOR_ADDRESS": "h:1", "JAXRL_NUM_PROCESSES": "two",
                                "JAXRL_PROCESS_ID": "0"})


def test_single_process_initialize_is_a_noop():
    import jax

    from jaxrl_llm.train.distributed import initialize_from_env

    assert initialize_from_env({}).source == "single"
    assert jax.process_count() == 1


def test_mesh_validation_against_the_device_count():
    import jax

    from jaxrl_llm.train.config import MeshConfig
    from jaxrl_llm.train.distributed import global_mesh, resolve_mesh_axes

    assert jax.device_count() == 8  # tests/conftest.py
    assert resolve_mesh_axes(-1, 2, 2) == {"data": 2, "fsdp": 2, "tensor": 2}
    assert resolve_mesh_axes(1, -1, 4, device_count=32) == {"data": 1, "fsdp": 8, "tensor": 4}
    assert dict(global_mesh(MeshConfig(data=2, fsdp=-1, tensor=1)).shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    with pytest.raises(ValueError, match=r"mesh data=2 x fsdp=2 x tensor=1 = 4, but there are 8 devices"):
        resolve_mesh_axes(2, 2, 1)
    with pytest.raises(ValueError, match=r"mesh.fsdp=3 x mesh.tensor=1 = 3 does not divide the 8 devices"):
        resolve_mesh_axes(-1, 3, 1)
    with pytest.raises(ValueError, match=r"mesh axes \['data', 'tensor'\] are all -1"):
        resolve_mesh_axes(-1, 1, -1)
    with pytest.raises(ValueError, match=r"mesh.tensor=0 is invalid"):
        resolve_mesh_axes(1, 8, 0)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"] or len(sys.argv) != 3:
        raise SystemExit("usage: python -m tests.train.test_distributed --worker OUT.npz")
    worker(sys.argv[2])
