"""A vLLM server killed between steps of `jaxrl train` (SIGKILL, after step 1 is logged):
the run stops with an error naming the failed step, the cause and --resume, after writing
a checkpoint of the last finished step (checkpoint.every_steps=0, so only the failure path
writes one); after the server is back, --resume finishes the run with every step logged
once. Runs near the end of the session (conftest): it restarts the shared server."""
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train.run.metrics import read_metrics

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def train_command(url: str, model_dir: str, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/demo.py"),
            "total_steps=3", "rollout.engine=vllm", f"rollout.server_urls=[{url}]", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4", "rollout.max_tokens=8", "train.micro_batch_size=8",
            "checkpoint.every_steps=0", "checkpoint.async_save=false", "metrics.tensorboard=false",
            f"run_dir={run_dir}", f"model.source={model_dir}", *extra]


# ~100 s on 2 cores (a vLLM server restart); in make test (CI)
def test_server_killed_between_steps_stops_with_a_resumable_checkpoint(vllm_server, smollm2, tmp_path):
    server = vllm_server.get()
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(REPO)
    run_dir = tmp_path / "run"
    child = subprocess.Popen(train_command(server.url, smollm2.hf_dir, run_dir), cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 900
    while not ((run_dir / "metrics.jsonl").exists() and (run_dir / "metrics.jsonl").read_text().strip()):
        assert child.poll() is None and time.time() < deadline, child.stdout.read()[-3000:]
        time.sleep(0.05)
    server.kill()
    output, _ = child.communicate(timeout=600)
    assert child.returncode != 0, output[-3000:]
    failed = re.search(r"step (\d) failed: (\w+)", output)
    assert failed, output[-3000:]
    failed_step = int(failed.group(1))
    assert failed_step in (2, 3)
    assert f"the learner state of step {failed_step - 1} is checkpointed at" in output and "--resume" in output
    assert (run_dir / "checkpoints" / str(failed_step - 1)).is_dir()

    server = vllm_server.get()  # a fresh server with the base weights; --resume pushes the checkpoint's
    try:
        done = subprocess.run(train_command(server.url, smollm2.hf_dir, run_dir, "--resume"), cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=900)
    finally:
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2, 3]
    print(f"\nfailure after the kill: {failed.group(0)}; resumed from step {failed_step - 1}")
