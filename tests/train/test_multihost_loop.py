"""The RL loop (`loop.train`, what `jaxrl train` runs) as 2 jax.distributed processes on
127.0.0.1, 2 CPU devices each: each process samples and grades half of every step's
prompts, the step batch is gathered on both, the learner trains over the global
4-device mesh. Two steps must equal one process on 4 devices with the same mesh
shape: same samples (SamplingParams.first_row), same metrics, same parameters.

Run as a script (`python -m tests.train.test_multihost_loop RUN_DIR MODEL_DIR OUT`) this
module is one training process."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest


ROOT = Path(__file__).resolve().parents[2]
OVERRIDES = ["rollout.engine=jax", "total_steps=2", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=6",
             "train.micro_batch_size=4", "train.lr=1e-3", "train.adam_eps=1e-5", "checkpoint.every_steps=1",
             "checkpoint.async_save=false", "metrics.tensorboard=false", "mesh.fsdp=-1"]


def run(run_dir: str, model_dir: str, out: str) -> None:
    """One process: trains with answers graded alternately right / wrong (a random tiny
    model never answers right, and the updates would be zero), then saves the params."""
    import jax

    from jaxrl_llm.train.run import loop

    from jaxrl_llm.train.sample import stage as sampling
    from jaxrl_llm.train.config import load_config
    from jaxrl_llm.train.distributed import gather_to_host
    from jaxrl_llm.train.sample.prompts import task_from_config
    from tests.train.tiny_run import raises_or_hangs

    cfg = load_config(str(ROOT / "experiments/demo.py"), [*OVERRIDES, f"model.source={model_dir}",
                                                          f"run_dir={run_dir}"])
    task = task_from_config(cfg)
    type(task).reward_fn = staticmethod(raises_or_hangs)  # 1.0 for "right", 0.0 otherwise
    sampling.decode_completions = lambda policy, rollouts: ["right", "wrong"] * (len(rollouts) // 2)
    result = loop.train(cfg, task=task)
    params = gather_to_host(result.state.params)
    if jax.process_index() == 0:
        leaves = {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}
        np.savez(out, **leaves)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(run_dir, model_dir, out, devices: int, extra_env: dict) -> subprocess.Popen:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu",
               PYTHONPATH=str(ROOT), **extra_env)
    return subprocess.Popen([sys.executable, "-m", "tests.train.test_multihost_loop", str(run_dir), model_dir, out],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(procs) -> None:
    try:
        logs = [p.communicate(timeout=480)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        logs = [p.communicate()[0] for p in procs]
    report = "\n".join(f"--- process {i} (exit {p.returncode}):\n{log[-3000:]}" for i, (p, log) in
                        enumerate(zip(procs, logs)))
    assert all(p.returncode == 0 for p in procs), report


def _metrics(run_dir: Path) -> list[dict]:
    from jaxrl_llm.train.run.loop import TIMING_METRICS

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in (*TIMING_METRICS, "time")} for r in rows]


@pytest.mark.slow  # make test-all; make test keeps test_distributed.py (two processes = one, the learner)
@pytest.mark.timeout(600)  # two RL processes, each allowed 480 s
def test_two_process_rl_loop_equals_one_process(tiny_model_dir, tmp_path):
    model_dir = tiny_model_dir
    port = _free_port()
    multi = [_start(tmp_path / "multi", model_dir, str(tmp_path / "multi.npz"), 2,
                    {"JAXRL_COORDINATOR_ADDRESS": f"127.0.0.1:{port}", "JAXRL_NUM_PROCESSES": "2",
                     "JAXRL_PROCESS_ID": str(pid)}) for pid in range(2)]
    _finish(multi)
    _finish([_start(tmp_path / "single", model_dir, str(tmp_path / "single.npz"), 4, {})])

    single, multi = _metrics(tmp_path / "single"), _metrics(tmp_path / "multi")
    assert [r["step"] for r in multi] == [1, 2] and [r["weight_version"] for r in multi] == [0.0, 1.0]
    for want, have in zip(single, multi, strict=True):
        assert want["reward"] == have["reward"] == 0.5
        for key in ("length_mean", "loss", "grad_norm", "entropy", "mismatch_k1"):
            assert have[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    # process 0 logged every group of the global batch: 2 prompts x 4 samples per step
    groups = [json.loads(line) for line in (tmp_path / "multi" / "groups.jsonl").read_text().splitlines()]
    assert [np.shape(g["rewards"]) for g in groups] == [(2, 4), (2, 4)]
    assert groups == [json.loads(line) for line in (tmp_path / "single" / "groups.jsonl").read_text().splitlines()]
    got, expected = np.load(tmp_path / "multi.npz"), np.load(tmp_path / "single.npz")
    initial = _initial_params(model_dir)
    for name in expected.files:
        assert not np.allclose(expected[name], initial[name]), f"{name} did not move: the check would be vacuous"
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-6, err_msg=name)


def _initial_params(model_dir: str) -> dict[str, np.ndarray]:
    import jax

    from jaxrl_llm.bridge import load_hf_dir

    _, params = load_hf_dir(model_dir, dtype="float32")
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(params)}


if __name__ == "__main__":
    run(*sys.argv[1:4])
