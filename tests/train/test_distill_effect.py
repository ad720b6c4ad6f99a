"""On-policy distillation does what it exists for: a student distilled from a teacher that
learned the task moves towards the teacher, with no task reward in its loss.

Setting (tests/train/learning_setup.py, CPU-sized): the teacher is a checkpoint of a run
that learned SpacesTask (dr_grpo, 8 steps, reward -> 1.0) from the tiny random model; the
student is that same tiny model, distilled from the teacher's run directory with
recipe.name=opd (distill.reward_weight = 0: the graders' rewards are measured, never used).
Its reverse KL to the teacher falls and its held-out score rises towards the teacher's.

Measured (2 shared cores): teacher rewards 0.44 -> 1.0; student reverse KL 7.8 -> 0.01 per
token over 16 steps, training reward 0.44 -> 1.0, held-out avg@4 0.60 (base) -> 1.00
(teacher 0.99). ~3 min wall, mostly compilation.
"""
from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.evaluation import evaluate_params
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.plan import plan_run
from tests.train.learning_setup import SpacesTask, learning_config

TEACHER_STEPS, STUDENT_STEPS, EVAL_SAMPLES = 8, 16, 4


def held_out(model_dir, policy, params, tmp_path) -> float:
    """avg@4 (mean reward) on 16 held-out prompts, the same seed for every model."""
    cfg = learning_config(model_dir, tmp_path / "eval", "task.eval_size=16")
    return evaluate_params(cfg, policy, params, samples=EVAL_SAMPLES, task=SpacesTask())[f"avg@{EVAL_SAMPLES}"]


@pytest.mark.slow  # ~3 min wall on 2 shared cores: a teacher run, an opd run, three evaluations
@pytest.mark.timeout(900)
def test_student_moves_towards_a_teacher_that_learned_the_task(learning_model_dir, learning_policy, tmp_path):
    teacher_cfg = learning_config(learning_model_dir, tmp_path / "teacher", f"total_steps={TEACHER_STEPS}")
    teacher = loop.train(teacher_cfg, task=SpacesTask(), policy=learning_policy)
    assert np.mean([r["reward"] for r in read_metrics(teacher_cfg.run_path)][-2:]) >= 0.9  # it learned the task

    cfg = learning_config(learning_model_dir, tmp_path / "student", "recipe.name=opd",
                          f"distill.teacher={teacher_cfg.run_path}", f"total_steps={STUDENT_STEPS}")
    assert plan_run(cfg).recipe.distill.reward_weight == 0.0  # no task reward in the loss
    student = loop.train(cfg, task=SpacesTask(), policy=learning_policy)
    rows = read_metrics(cfg.run_path)
    kl = [r["teacher_reverse_kl"] for r in rows]
    rewards = [r["reward"] for r in rows]
    assert np.mean(kl[-3:]) < 0.2 * np.mean(kl[:3]), kl  # the reverse KL to the teacher falls
    assert np.mean(rewards[-3:]) > np.mean(rewards[:3]) + 0.2, rewards  # the graders' reward rises

    base, taught, distilled = (held_out(learning_model_dir, learning_policy, p, tmp_path)
                               for p in (learning_policy.params, teacher.params, student.params))
    assert taught > base + 0.2, (base, taught)
    assert distilled > base + 0.5 * (taught - base), (base, distilled, taught)  # most of the way to the teacher
