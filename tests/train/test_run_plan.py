"""The run plan (`train.plan.plan_run`): each fact derived once from the config and the task,
checked against what the config says by hand, and the sampling mode it selects."""
import functools

import pytest

from jaxrl_llm import core
from jaxrl_llm.data import make_task
from jaxrl_llm.train.sample import stage as sampling
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides
from jaxrl_llm.train.plan import plan_run


def cfg(*overrides: str) -> Config:
    return apply_overrides(Config(), list(overrides))


def test_plain_grpo_run():
    plan = plan_run(cfg("recipe.name=grpo"))
    assert (plan.dynamic_sampling, plan.sampling_rounds, plan.env_task, plan.vineppo) == (False, 1, False, False)
    assert plan.carries_sampled_ahead and plan.recipe.correction is None  # grpo has no correction
    assert not plan_run(cfg("recipe.name=grpo"), processes=2).carries_sampled_ahead  # each holds a share only


def test_dynamic_sampling_comes_from_the_recipe_or_the_rollout_section():
    dapo = plan_run(cfg("recipe.name=dapo", "rollout.dynamic_sampling_rounds=3"))
    assert dapo.dynamic_sampling and dapo.sampling_rounds == 3 and not dapo.carries_sampled_ahead
    off = plan_run(cfg("recipe.name=dapo", "rollout.dynamic_sampling=false", "rollout.dynamic_sampling_rounds=3"))
    assert not off.dynamic_sampling and off.sampling_rounds == 1 and off.carries_sampled_ahead
    on = plan_run(cfg("recipe.name=grpo", "rollout.dynamic_sampling=true"))
    assert on.dynamic_sampling and on.sampling_rounds == 4  # the field's default


def test_async_runs_get_token_tis_against_staleness_unless_the_recipe_has_a_correction():
    plan = plan_run(cfg("recipe.name=grpo", "rollout.max_lag=1"))
    assert isinstance(plan.recipe.correction, functools.partial)
    assert plan.recipe.correction.func is core.token_tis and plan.recipe.correction.keywords == {"cap": 2.0}
    own = cfg("recipe.name=grpo", "recipe.correction=sequence_mis", "recipe.correction_cap=3.0")
    kept = plan_run(apply_overrides(own, ["rollout.max_lag=1"])).recipe.correction
    assert kept.func is core.sequence_mis and kept.keywords == {"cap": 3.0}
    # recipe.correction=off: no correction at all, not even the staleness default (experiment 10's `none`)
    assert plan_run(cfg("recipe.name=grpo", "recipe.correction=off", "rollout.max_lag=2")).recipe.correction is None


def test_the_task_object_decides_whether_the_run_is_an_environment():
    """A task built by a factory may be an environment that the config's task section does not name."""
    config = cfg("recipe.name=grpo")
    plan = plan_run(config, make_task("guess_number"))
    assert plan.env_task and not plan.carries_sampled_ahead  # environment batches are resampled
    assert not plan_run(config, make_task("addition")).env_task
    with pytest.raises(ConfigError, match="dynamic_sampling is not supported with a multi-turn environment"):
        plan_run(cfg("recipe.name=dapo"), make_task("guess_number"))
    with pytest.raises(ConfigError, match="multi-turn environment.*vineppo"):
        plan_run(cfg("recipe.name=vineppo"), make_task("guess_number"))


@pytest.mark.parametrize("overrides, task, mode", [
    (("recipe.name=grpo",), "addition", sampling.PlainBatch),
    (("recipe.name=dapo",), "addition", sampling.DynamicRounds),
    (("recipe.name=grpo",), "guess_number", sampling.Episodes),
])
def test_the_plan_selects_one_sampling_mode(overrides, task, mode):
    config = cfg(*overrides)
    task_object = make_task(task)
    chosen = sampling.step_sampling(config, plan_run(config, task_object), policy=None, task=task_object, pool=None)
    assert type(chosen) is mode
