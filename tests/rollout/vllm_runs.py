"""Runs of `jaxrl train` against the shared vLLM CPU server (the `vllm_server` fixture of
tests/rollout/conftest.py), shared by the vLLM loop tests."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train.run.metrics import read_metrics

REPO = Path(__file__).resolve().parents[2]


def train_two_steps_on_server(server, smollm2, run_dir: Path, *overrides: str) -> list[dict]:
    """`jaxrl train` of the demo config for 2 steps (2 prompts x 4 samples, 8 tokens) in its own
    one-device process on the shared server; the server is restored to the base weights
    afterwards, whatever happened. Returns the run's metrics rows."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device: the learner as on a laptop
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/demo.py"),
           "total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{server.url}]",
           "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=8",
           "train.micro_batch_size=8", "checkpoint.every_steps=0", "checkpoint.async_save=false",
           "metrics.tensorboard=false", f"run_dir={run_dir}", f"model.source={smollm2.hf_dir}", *overrides]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:  # the shared server goes back to the base weights for the other tests
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    return read_metrics(run_dir)
