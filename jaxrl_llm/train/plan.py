"""The run planner: what the RL loop runs from a `Config` and its task (`plan_run` -> `RunPlan`:
the recipe with the config's overrides and, with rollout.max_lag > 0, token TIS against the
staleness; whether the loop over-samples; whether the task is a multi-turn environment; what a
checkpoint carries), derived once and passed down to the sampling and learning stages. The
refusals are the config's own (`config.checks.check_runnable`); `train()` plans with the task it
built, since a factory function or a `task=` object may turn out to be an environment only then.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING

from jaxrl_llm import core
from jaxrl_llm.data import EnvTask, Task
from jaxrl_llm.train.config.checks import check_runnable

if TYPE_CHECKING:
    from jaxrl_llm.train.config import Config


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """The facts of a run that follow from its config and task, derived once (`plan_run`)."""

    recipe: core.Recipe  # the config's recipe; with rollout.max_lag > 0, token TIS against staleness
    dynamic_sampling: bool  # over-sample prompt rounds until the step holds informative groups
    sampling_rounds: int  # prompt rounds drawn per step (1 without dynamic sampling)
    env_task: bool  # a multi-turn environment: a step's groups are episodes
    vineppo: bool  # Monte-Carlo values: K continuations per chunk start after grading
    greedy_baseline: bool  # ReMax: the job also draws one greedy response per prompt, its reward the baseline
    carries_sampled_ahead: bool  # checkpoints carry the batches sampled ahead (exact async resume)


def plan_run(cfg: Config, task: Task | None = None, *, processes: int = 1) -> RunPlan:
    """The run plan of `cfg` (with `task`, the task object the loop built; else the config's task
    section decides whether it is an environment) on `processes` JAX processes. Raises
    ConfigError, naming the field, for a combination the loop cannot run (`config.checks`)."""
    facts = check_runnable(cfg, env_task=None if task is None else isinstance(task, EnvTask), processes=processes)
    recipe = facts.recipe
    return RunPlan(
        # recipe.correction=off: no correction at all, not even the staleness default
        recipe=staleness_corrected(recipe, cfg.recipe.correction_cap or 2.0)
        if cfg.rollout.max_lag > 0 and cfg.recipe.correction != "off" else recipe,
        dynamic_sampling=facts.dynamic_sampling,
        sampling_rounds=cfg.rollout.dynamic_sampling_rounds if facts.dynamic_sampling else 1,
        env_task=facts.env_task, vineppo=facts.vineppo, greedy_baseline=facts.greedy_baseline,
        # Not with several processes (each holds only its share), nor dynamic sampling (a step's rows
        # come from several prompt rounds), nor an environment (its batches are resampled instead).
        carries_sampled_ahead=processes == 1 and not facts.dynamic_sampling and not facts.env_task)


def staleness_corrected(recipe: core.Recipe, cap: float = 2.0) -> core.Recipe:
    """The recipe with token TIS min(pi_old/mu, cap) when it has no correction of its own
    (a recipe's own correction, e.g. sequence MIS, already uses the sampler logprobs): what a run
    with rollout.max_lag > 0 trains with (train/sample/async_rollout.py)."""
    if recipe.correction is not None:
        return recipe
    return dataclasses.replace(recipe, correction=functools.partial(core.token_tis, cap=cap))
