"""experiments/custom_reward.py: a reward function defined in the experiment file itself,
graded in worker processes that import it by its module path, over a CSV file."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from jaxrl_llm.data import HELDOUT, TRAIN
from jaxrl_llm.data.plugins import load_object
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.sample.grading import grade
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample.prompts import task_from_config

REPO = Path(__file__).resolve().parents[2]
EXPERIMENT = REPO / "experiments/custom_reward.py"


def test_the_experiments_own_reward_grades_its_csv_in_a_worker():
    cfg = load_config(EXPERIMENT, ["rollout.engine=jax"])
    task = task_from_config(cfg)
    assert task.reward_fn is load_object(cfg.task.reward_fn)
    assert Path(task.reward_fn.__code__.co_filename) == EXPERIMENT  # the function of this very file
    words = {e.metadata["word"]: e for e in task.all_examples(TRAIN) + task.all_examples(HELDOUT)}
    assert len(words) == 32 and all(len(w) == int(e.answer) for w, e in words.items())
    banana = words["banana"]
    assert banana.prompt == "How many letters are in the word 'banana'? Answer with just the number."
    texts = ["6", "It has 7 letters.", "5", "9", "banana"]
    with GraderPool(1, timeout_s=cfg.task.reward_timeout_s) as pool:  # not trusted: graded in the worker
        graded = grade(pool, task, texts, [banana], len(texts))
    assert graded.rewards.tolist() == [[1.0, 0.5, 0.5, 0.0, 0.0]]  # by hand: |n - 6| = 0, 1, 1, 3; no number
    assert (graded.errors, graded.timeouts) == (0, 0)


@pytest.mark.slow  # ~1 min under load: a real `jaxrl train --config` run of the example, 2 steps
def test_jaxrl_train_runs_the_example(tiny_model_dir, tmp_path):  # noqa: F811
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(EXPERIMENT), "rollout.engine=jax",
         f"model.source={tiny_model_dir}", f"run_dir={run_dir}", "total_steps=2", "rollout.prompts_per_step=2",
         "rollout.samples_per_prompt=4", "rollout.max_tokens=6", "train.micro_batch_size=4",
         "metrics.tensorboard=false", "checkpoint.async_save=false", "task.eval_samples=1"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = read_metrics(run_dir)
    assert [row["step"] for row in rows] == [1, 2]
    assert all(row["reward_errors"] == 0.0 and row["reward_timeouts"] == 0.0 for row in rows)
