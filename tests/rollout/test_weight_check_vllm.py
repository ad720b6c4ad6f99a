"""Every weight push of the RL loop is verified by a logprob probe (train/sample/weight_check.py).
Through the loop's own path and a real vLLM server, a deliberately wrong export (layer 5's
down_proj zeroed) stops the run at step 1 with a clear error and a checkpoint of step 1;
`jaxrl train --resume` (its own process, one CPU device, as a user runs it) with the right
export pushes the restored weights (verified) and finishes step 2: an RL step through vLLM
that samples from the synced weight version 1, grades every sample and reports the sync's
and the probe's cost. (test_loop_vllm.py runs two plain steps; it is slow, this test holds
its checks for `make test`.)"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample.weight_check import PROBE_ATOL
from tests.rollout.wrong_weights_run import CONFIG, train_overrides

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1800)  # two `jaxrl train` runs, each allowed 900 s
def test_wrong_weights_pushed_by_the_loop_stop_the_run_with_a_resumable_checkpoint(vllm_server, smollm2, tmp_path):
    server = vllm_server.get()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as `jaxrl train` on a laptop
    env["PYTHONPATH"] = str(REPO)
    run_dir = str(tmp_path / "run")
    cmd = [sys.executable, "-m", "tests.rollout.wrong_weights_run", server.url, smollm2.hf_dir, run_dir]
    resume = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(CONFIG),
              *train_overrides(server.url, smollm2.hf_dir, run_dir), "--resume"]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        resumed = subprocess.run(resume, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    finally:  # the shared server goes back to the base weights for the other tests
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"] is not None, "the wrong weights were not detected"
    assert out["error"].startswith("step 1 failed: WeightSyncError: after reloading version 1")
    assert "probe logprobs differ" in out["error"]
    assert "the learner state of step 1 is checkpointed at" in out["error"] and "--resume" in out["error"]
    wrong_diff = float(re.search(r"differ from the learner's by up to ([0-9.e+-]+)", out["error"]).group(1))
    assert wrong_diff > 2 * PROBE_ATOL["float32"], wrong_diff
    assert out["checkpoints_after_failure"] == [1]

    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    (row,) = read_metrics(run_dir)  # step 1 stopped before its metrics line; step 2 ran after the resume
    assert row["step"] == 2
    assert row["weight_version"] == 1.0  # step 2 sampled from the weights synced after step 1
    assert row["reward_errors"] == 0.0 and row["time_sync_s"] > 0.0
    assert row["reward"] * 8 == pytest.approx(round(row["reward"] * 8))  # graded: the mean of 8 scores in {0, 1}
    assert row["weight_probe_diff"] <= PROBE_ATOL["float32"]
    assert row["time_verify_s"] > 0
    print(f"\nprobe cost per step: {row['time_verify_s']:.3f} s of {row['time_sync_s']:.2f} s sync; "
          f"right weights max diff {row['weight_probe_diff']:.2e}, wrong weights {wrong_diff:.3g}")
