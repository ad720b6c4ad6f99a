"""Two RL steps through the real vLLM CPU server, run as a user runs them (`jaxrl train`
in its own process, one CPU device): rollouts, grading, a learner step and the weight
sync after each step. The shared server is restored to the base weights afterwards.

Both tests are slow (`make test-all`): `make test` keeps their RL-step checks through
test_weight_check_vllm.py, whose `jaxrl train --resume` step samples from the synced
weight version 1, grades every sample and reports the sync's cost."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, bridge_export
from jaxrl_llm.train.run.metrics import read_metrics
from tests.rollout.vllm_runs import train_two_steps_on_server

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


# The demo's recipe, and the losses of issue 38 part 2 (DPPO, Clip-Cov / KL-Cov with their step-batch token
# selection, GPG, SAPO with its temperatures) through the same real server.
RECIPES = {"demo": [], "dppo_tv": ["recipe.name=dppo_tv"], "dppo_kl": ["recipe.name=dppo_kl"],
           "clip_cov": ["recipe.name=clip_cov", "recipe.cov_fraction=0.05"],
           "kl_cov": ["recipe.name=kl_cov", "recipe.cov_fraction=0.05"], "gpg": ["recipe.name=gpg"],
           "sapo": ["recipe.loss=sapo", "recipe.sapo_tau_pos=2.0"]}


@pytest.mark.slow  # ~70 s on 2 cores each; its checks run in make test through test_weight_check_vllm.py
@pytest.mark.parametrize("recipe", list(RECIPES))
def test_two_rl_steps_through_vllm_advance_the_weight_version(vllm_server, smollm2, tmp_path, recipe):
    rows = train_two_steps_on_server(vllm_server.get(), smollm2, tmp_path / "run", *RECIPES[recipe])
    assert [r["step"] for r in rows] == [1, 2]
    if recipe in ("clip_cov", "kl_cov"):  # max(1, floor(0.05 n)) of the step's n response tokens
        for r in rows:
            n = r["num_response_tokens"]
            assert r["selected_token_fraction"] == pytest.approx(max(1, int(0.05 * n)) / n, abs=1e-6)
    assert [r["weight_version"] for r in rows] == [0.0, 1.0]  # step 2 sampled from the synced weights
    for r in rows:
        assert r["reward_errors"] == 0.0 and r["time_sync_s"] > 0.0
        # graded: the reward is the mean of 8 scores in {0, 1}
        assert r["reward"] * 8 == pytest.approx(round(r["reward"] * 8))


@pytest.mark.slow  # ~2-3 min on 2 cores
def test_dapo_dynamic_sampling_and_eval_every_through_vllm(vllm_server, smollm2, tmp_path):
    """DAPO's dynamic sampling (extra rounds of fresh prompts) and held-out evaluation every
    step, both on the real server: every group the learner sees has accuracy strictly
    between 0 and 1, each step batch is full, and eval.jsonl has one record per step."""
    import json

    import numpy as np

    from jaxrl_llm.train.run.metrics import read_groups

    server = vllm_server.get()
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/demo.py"),
           "recipe.name=dapo", "total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{server.url}]",
           "rollout.prompts_per_step=4", "rollout.samples_per_prompt=2", "rollout.max_tokens=8",
           "rollout.dynamic_sampling_rounds=8", "task.eval_every=1", "task.eval_size=4", "task.eval_samples=2",
           "train.micro_batch_size=8", "checkpoint.every_steps=0", "checkpoint.async_save=false",
           "metrics.tensorboard=false", f"run_dir={run_dir}", f"model.source={smollm2.hf_dir}"]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:  # the shared server goes back to the base weights for the other tests
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    rows, groups = read_metrics(run_dir), read_groups(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    for row, g in zip(rows, groups):
        accuracy = (np.asarray(g["rewards"]) >= 1.0).mean(axis=1)
        assert accuracy.shape == (4,) and np.all((accuracy > 0) & (accuracy < 1)), g  # full, none uninformative
        assert row["dynamic_sampling_unfilled"] == 0.0 and row["zero_variance_group_fraction"] == 0.0
    # groups of 2 at pass rate ~0.3 are mostly all-wrong or all-right: rounds were dropped and redrawn
    assert sum(r["dynamic_sampling_rounds"] for r in rows) > len(rows)
    records = [json.loads(line) for line in (run_dir / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert np.asarray(r["correct"]).shape == (4, 2)
        assert r["pass@1"] == pytest.approx(np.mean(r["correct"]), abs=1e-6)


@pytest.mark.slow  # ~70 s on 2 cores beside the shared server's start, as the GRPO case above
def test_opd_through_vllm_with_the_student_as_teacher_gives_a_zero_signal(vllm_server, smollm2, tmp_path):
    """On-policy distillation on the vLLM engine (`jaxrl train`, SmolLM2-135M): the teacher (the
    bundled SmolLM2, the student's own weights) scores the server's samples in the learner's
    pi_old pass; its signal is exactly 0 at every token, and its fp32 copy costs 4 bytes per
    parameter."""
    import jax
    import numpy as np

    rows = train_two_steps_on_server(vllm_server.get(), smollm2, tmp_path / "run", "recipe.name=opd",
                                     "distill.teacher=smollm2")
    assert [r["step"] for r in rows] == [1, 2] and [r["weight_version"] for r in rows] == [0.0, 1.0]
    params = sum(int(np.prod(np.shape(x))) for x in jax.tree.leaves(smollm2.params))
    for r in rows:
        assert r["teacher_signal_abs_max"] == 0.0 and r["teacher_reverse_kl"] == 0.0, r
        assert r["num_response_tokens"] > 0 and r["teacher_bytes"] == 4 * params  # demo.py: train.precision=fp32
