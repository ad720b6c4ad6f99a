"""On-policy distillation through the real RL loop, on the tiny learning setup
(tests/train/learning_setup.py): the teacher scores the sampled tokens in the learner's
pi_old pass, the run's metrics report it, and configs that cannot run are refused."""
from __future__ import annotations

import json
import shutil

import jax
import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.run.metrics import read_metrics
from tests.train.learning_setup import SpacesTask, flat_params, learning_config, make_tiny_model_dir


def fp32_bytes(params) -> int:
    return sum(int(np.prod(np.shape(x))) * 4 for x in jax.tree.leaves(params))


def test_teacher_equal_to_student_gives_exactly_zero_signal_in_a_real_run(learning_model_dir, learning_policy,
                                                                           tmp_path):
    """teacher = the student's own weights: log pi_T - log pi_old is 0 at every token (both from
    the same pi_old pass), so with reward_weight 0 every gradient is 0 and the student stays
    the teacher, bit for bit, step after step."""
    cfg = learning_config(learning_model_dir, tmp_path / "self", "recipe.name=opd",
                          f"distill.teacher={learning_model_dir}", "total_steps=2")
    out = loop.train(cfg, task=SpacesTask(), policy=learning_policy)
    rows = read_metrics(cfg.run_path)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["teacher_signal_abs_max"] == 0.0, row  # max over tokens of |A_t|: every token is 0
        assert row["teacher_reverse_kl"] == 0.0 and row["advantage_token_mean"] == 0.0, row
        assert row["num_response_tokens"] > 0
        assert row["teacher_bytes"] == fp32_bytes(learning_policy.params)  # train.precision=fp32: one fp32 copy
        assert "reference_bytes" not in row  # no KL term: the teacher is the only extra copy
    assert np.array_equal(flat_params(out.params), flat_params(learning_policy.params))


@pytest.fixture(scope="module")
def other_teacher_dir(tmp_path_factory) -> str:
    """Another random tiny model over the same tokenizer (seed 1)."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("teacher") / "model", seed=1)


def test_two_step_opd_run_on_the_jax_engine(learning_model_dir, learning_policy, other_teacher_dir, tmp_path):
    cfg = learning_config(learning_model_dir, tmp_path / "opd", "recipe.name=opd",
                          f"distill.teacher={other_teacher_dir}", "total_steps=2")
    out = loop.train(cfg, task=SpacesTask(), policy=learning_policy)
    rows = read_metrics(cfg.run_path)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["teacher_reverse_kl"] > 0.1 and row["teacher_signal_abs_max"] > 0, row
    assert not np.array_equal(flat_params(out.params), flat_params(learning_policy.params))


def test_a_teacher_with_another_tokenizer_is_refused(learning_model_dir, learning_policy, tmp_path):
    teacher = tmp_path / "teacher"
    shutil.copytree(learning_model_dir, teacher)
    spec = json.loads((teacher / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "hello", "world"
    vocab[a], vocab[b] = vocab[b], vocab[a]  # two tokens swap ids
    (teacher / "tokenizer.json").write_text(json.dumps(spec))
    cfg = learning_config(learning_model_dir, tmp_path / "run", "recipe.name=opd", f"distill.teacher={teacher}")
    with pytest.raises(ConfigError, match=r"distill.teacher = .*another tokenizer than model.source.*2 differ"):
        loop.train(cfg, task=SpacesTask(), policy=learning_policy)


@pytest.mark.parametrize("overrides, names", [
    (["recipe.name=opd"], ["recipe.name = 'opd'", "distill.teacher is not set"]),
    (["distill.reward_weight=0.5"], ["distill.reward_weight = 0.5", "distill.teacher is not"]),
    (["recipe.name=opd", "distill.teacher=/no/such/teacher"], ["distill.teacher = '/no/such/teacher'", "no such"]),
    (["recipe.name=ppo", "distill.teacher=smollm2"], ["distill.teacher with recipe.name = 'ppo'", "critic"]),
    (["recipe.name=vineppo", "distill.teacher=smollm2"], ["recipe.advantage = 'vineppo'"]),
    (["recipe.name=opd", "distill.teacher=smollm2", "task.name=guess_number"], ["multi-turn", "task.name"]),
])
def test_combinations_that_cannot_run_are_refused_when_the_config_loads(overrides, names, tmp_path):
    with pytest.raises(ConfigError) as err:
        learning_config("smollm2", tmp_path / "run", *overrides)
    for name in names:
        assert name in str(err.value), str(err.value)


def test_distill_teacher_on_another_recipe_mixes_the_reward_with_weight_one(tmp_path):
    from jaxrl_llm.train.plan import plan_run

    plain = plan_run(learning_config("smollm2", tmp_path / "a")).recipe
    mixed = plan_run(learning_config("smollm2", tmp_path / "b", "distill.teacher=smollm2")).recipe
    opd = plan_run(learning_config("smollm2", tmp_path / "c", "recipe.name=opd", "distill.teacher=smollm2")).recipe
    assert plain.distill is None and mixed.distill.reward_weight == 1.0 and opd.distill.reward_weight == 0.0
