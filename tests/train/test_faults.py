"""Fault injection on a run that learns (tests/train/learning_setup.py), each with a stated
outcome:

- the newest checkpoint is unreadable: --resume falls back to the previous one, says so,
  and the run ends with the parameters of the uninterrupted run;
- a grader process is killed mid-step: the step completes and the answer counts as an error.

(SIGTERM / SIGKILL during a checkpoint write: tests/train/test_checkpoint.py; a vLLM
server killed between steps: tests/rollout/test_server_faults.py.)
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.train.run import loop

from jaxrl_llm.train.sample import stage as sampling
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.run.run_state import restore_params
from tests.train.learning_setup import SpacesTask, dies_on_die, flat_params, learning_config, space_share


def damage(step_dir: Path) -> list[str]:
    """Truncates every array data file of a finished checkpoint step (as a full disk or a
    bad copy would); returns the damaged files."""
    files = [p for p in (step_dir / "state").rglob("*") if p.is_file() and "d" in p.relative_to(step_dir).parts]
    files = files or [p for p in (step_dir / "state").rglob("*") if p.is_file()]
    for path in files:
        path.write_bytes(b"")
    return [str(p.relative_to(step_dir)) for p in files]


def test_unreadable_newest_checkpoint_resume_falls_back_to_the_previous_one(learning_model_dir, learning_policy,
                                                                            tmp_path, caplog):
    cfg = learning_config(learning_model_dir, tmp_path / "run", "total_steps=4", "checkpoint.every_steps=2",
                          "checkpoint.keep=3")
    loop.train(cfg, task=SpacesTask(), policy=learning_policy)
    _, want = restore_params(cfg, learning_policy)  # the uninterrupted run's step-4 params
    assert damage(Path(cfg.checkpoint_path) / "4")
    with caplog.at_level("INFO", logger="jaxrl_llm"):
        out = loop.train(cfg, task=SpacesTask(), resume=True, policy=learning_policy)
    messages = [r.getMessage() for r in caplog.records]
    assert any("checkpoints/4 cannot be restored" in m for m in messages), messages
    assert any(m.startswith("resuming from step 2, the newest readable checkpoint") for m in messages), messages
    assert any(m.startswith("resumed from step 2 ") for m in messages), messages
    assert (Path(cfg.checkpoint_path) / "4.unreadable").is_dir()
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=3) as ckpt:
        assert ckpt.all_steps() == [2, 4]  # step 4 written again by the resumed run
    assert [r["step"] for r in read_metrics(cfg.run_path)] == [1, 2, 3, 4]
    diff = float(np.max(np.abs(flat_params(out.params) - flat_params(want))))
    assert diff <= 1e-6, diff


def test_a_killed_grader_process_costs_one_answer_and_the_step_completes(learning_model_dir, learning_policy,
                                                                          tmp_path, monkeypatch):
    cfg = learning_config(learning_model_dir, tmp_path / "run", "total_steps=2", "checkpoint.every_steps=0",
                          "task.reward_workers=2")
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    texts = ["die"] + [" a b", "c d e f"] * ((n - 1) // 2) + [" x"]
    monkeypatch.setattr(sampling, "decode_completions", lambda policy, rollouts: texts)
    out = loop.train(cfg, task=SpacesTask(reward_fn=dies_on_die), policy=learning_policy)
    assert out.step == 2
    expected = sum(space_share(t, None) for t in texts[1:]) / n  # the killed answer scores 0
    for row in read_metrics(cfg.run_path):
        assert row["reward_errors"] == 1.0 and row["reward_timeouts"] == 0.0
        assert row["reward"] == pytest.approx(expected)
