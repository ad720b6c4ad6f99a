"""kill -9 + --resume of an on-policy distillation run is exact (as tests/train/test_resume_learning.py
for the RL recipes): the teacher is loaded again from distill.teacher on resume, so the resumed
run reproduces the uninterrupted run's per-step metrics (teacher_reverse_kl included) and final
parameters; the killed child lost work (its newest checkpoint is older than its last logged step).
"""
from __future__ import annotations

import signal

import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.run.metrics import read_metrics
from tests.train.learning_setup import SpacesTask, flat_params, learning_config, make_tiny_model_dir
from tests.train.kill_resume import PARAM_ATOL, assert_rows_equal, kill_after_logged_step
from tests.train.tiny_run import model_metrics

STEPS, EVERY, KILL_AFTER = 5, 2, 3


@pytest.mark.slow  # ~1.5 min CPU, 5 min wall on 2 shared cores: three runs, one a child process
@pytest.mark.timeout(900)
def test_kill_9_then_resume_of_an_opd_run_equals_the_uninterrupted_run(learning_model_dir, learning_policy,
                                                                        tmp_path):
    teacher = make_tiny_model_dir(tmp_path / "teacher", seed=1)  # another random model, same tokenizer
    extra = [f"total_steps={STEPS}", "recipe.name=opd", f"distill.teacher={teacher}"]
    straight_cfg = learning_config(learning_model_dir, tmp_path / "straight", *extra)
    straight = loop.train(straight_cfg, task=SpacesTask(), policy=learning_policy)
    want = model_metrics(straight_cfg.run_path)
    assert all(r["teacher_reverse_kl"] > 0.1 for r in want), want  # a real teacher signal at every step
    moved = float(np.max(np.abs(flat_params(straight.params) - flat_params(learning_policy.params))))
    assert moved > 1e3 * PARAM_ATOL, moved  # the student learned, so a wrong resume could show

    crashed = tmp_path / "crashed"
    overrides = [*extra, f"checkpoint.every_steps={EVERY}"]
    rc = kill_after_logged_step(learning_model_dir, crashed, KILL_AFTER, overrides)
    assert rc == -signal.SIGKILL
    cfg = learning_config(learning_model_dir, crashed, *overrides)
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=100) as ckpt:
        on_disk = ckpt.all_steps()
    assert max(on_disk) < KILL_AFTER <= len(read_metrics(crashed)), (on_disk, "no work was lost")

    resumed = loop.train(cfg, task=SpacesTask(), resume=True, policy=learning_policy)
    assert resumed.step == STEPS
    assert_rows_equal(model_metrics(crashed), want)
    final_diff = float(np.max(np.abs(flat_params(resumed.params) - flat_params(straight.params))))
    assert final_diff <= PARAM_ATOL, final_diff
