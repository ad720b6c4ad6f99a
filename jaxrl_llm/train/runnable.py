"""What the RL loop runs from a `Config`: the run plan (`plan_run`: the recipe with the config's
overrides, whether the loop over-samples, whether the task is a multi-turn environment, what a
checkpoint carries), derived once and passed down, and the cross-field checks that refuse,
naming the field, a combination the loop cannot run. Every `Config` is checked when it is built
(`check_runnable`, without the task object); `train()` plans again with the task it built, since
a factory function or a `task=` object may turn out to be an environment only then.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING

from jaxrl_llm import core
from jaxrl_llm.data import EnvTask, Task
from jaxrl_llm.train.async_rollout import staleness_corrected
from jaxrl_llm.train.distill_config import check_distill, with_distillation
from jaxrl_llm.train.task_plugins import is_env_task
from jaxrl_llm.utils.typed_config import ConfigError

if TYPE_CHECKING:  # config.py imports this module to check every Config it builds
    from jaxrl_llm.train.config import Config, RecipeConfig


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
    ConfigError, naming the field, for a combination the loop cannot run."""
    try:
        recipe = recipe_from_config(cfg)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"recipe: {err}") from None
    over_sample = dynamic_sampling(cfg)
    env = isinstance(task, EnvTask) if task is not None else is_env_task(cfg.task)
    plan = RunPlan(
        recipe=staleness_corrected(recipe, cfg.recipe.correction_cap or 2.0) if cfg.rollout.max_lag > 0 else recipe,
        dynamic_sampling=over_sample, sampling_rounds=cfg.rollout.dynamic_sampling_rounds if over_sample else 1,
        env_task=env, vineppo=isinstance(recipe.advantage_fn, core.MonteCarloAdvantage),
        greedy_baseline="baseline_rewards" in getattr(recipe.advantage_fn, "inputs", ()),
        # Not with several processes (each holds only its share), nor dynamic sampling (a step's rows
        # come from several prompt rounds), nor an environment (its batches are resampled instead).
        carries_sampled_ahead=processes == 1 and not over_sample and not env)
    _check(cfg, plan, recipe)
    _check_extra_inputs(cfg, plan, recipe, processes)
    return plan


def recipe_from_config(cfg: Config) -> core.Recipe:
    """`core.get_recipe(cfg.recipe.name)` with the config's explicit overrides (None keeps
    the recipe's own choice), through `core.customize_recipe`. The constant aggregation's
    L_const defaults to rollout.max_tokens."""
    rc = cfg.recipe
    base = core.get_recipe(rc.name)
    _check_loss_fields(rc, base)
    recipe = core.customize_recipe(
        base, advantage=rc.advantage, loss=rc.loss, aggregation=rc.aggregation,
        constant_length=rc.constant_length, eps_low=rc.eps_low, eps_high=rc.eps_high, dual_clip=rc.dual_clip_c,
        kl_beta=rc.kl_beta, kl_estimator=rc.kl_estimator, kl_mode=rc.kl_mode, correction=rc.correction,
        correction_cap=rc.correction_cap, filter_zero_variance_groups=rc.filter_zero_variance_groups,
        loss_params=_set_values(rc, LOSS_FIELDS), selection_params=_set_values(rc, SELECTION_FIELDS))
    if isinstance(recipe.advantage_fn, core.MultiRewardAdvantage) and cfg.task.reward_weights:
        recipe = dataclasses.replace(recipe, advantage_fn=core.MultiRewardAdvantage(tuple(cfg.task.reward_weights)))
    if recipe.aggregation == "constant" and recipe.constant_length is None:
        recipe = dataclasses.replace(recipe, constant_length=cfg.rollout.max_tokens)
    if rc.mask_truncated is not None:
        recipe = dataclasses.replace(recipe, mask_truncated=rc.mask_truncated)
    recipe = with_distillation(recipe, cfg.distill)
    return dataclasses.replace(recipe, overlong=_overlong(recipe.overlong, rc, cfg.rollout.max_tokens))


# recipe.<field> -> the keyword it binds on the policy loss / on the token selection (Clip-Cov, KL-Cov).
LOSS_FIELDS = {"eps_low": "eps_low", "eps_high": "eps_high", "dual_clip_c": "dual_clip", "dppo_threshold": "threshold",
               "sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg", "kl_cov_coef": "kl_coef"}
SELECTION_FIELDS = {"cov_fraction": "fraction", "clip_cov_lower": "lower", "clip_cov_upper": "upper"}
_CORE_KEYWORDS = ("eps_low", "eps_high", "dual_clip_c")  # customize_recipe's own arguments


def _set_values(rc: RecipeConfig, fields: dict[str, str]) -> dict:
    return {keyword: getattr(rc, name) for name, keyword in fields.items()
            if getattr(rc, name) is not None and name not in _CORE_KEYWORDS}


def _check_loss_fields(rc: RecipeConfig, base: core.Recipe) -> None:
    """Refuses, naming the field, a loss hyperparameter that the run's loss (recipe.loss, else the
    recipe's own) does not take, e.g. recipe.sapo_tau_pos with ppo_clip."""
    loss_fn = core.POLICY_LOSSES[rc.loss] if rc.loss else getattr(base.policy_loss_fn, "func", base.policy_loss_fn)
    loss_name = rc.loss or next(n for n, f in core.POLICY_LOSSES.items() if f is loss_fn)
    selection = core.entropy_control.SELECTIONS.get(loss_fn)
    for name, keyword in {**LOSS_FIELDS, **SELECTION_FIELDS}.items():
        value = getattr(rc, name)
        target = loss_fn if name in LOSS_FIELDS else getattr(selection, "func", None)
        if value is None or (target is not None and keyword in inspect.signature(target).parameters):
            continue
        takes = [n for n, f in core.POLICY_LOSSES.items() if keyword in inspect.signature(f).parameters]
        if name in SELECTION_FIELDS:
            takes = [n for n, f in core.POLICY_LOSSES.items() if f in core.entropy_control.SELECTIONS]
        raise ConfigError(f"recipe.{name} = {value!r} is set, but the run's policy loss {loss_name!r} has no "
                          f"{keyword!r}; valid: recipe.loss in {takes}, or leave recipe.{name} unset")


def _overlong(base: core.OverlongPenalty | None, rc: RecipeConfig, max_tokens: int) -> core.OverlongPenalty | None:
    """The overlong penalty over this run's generation limit: L_max = rollout.max_tokens, the
    buffer from recipe.overlong_buffer or, when None, the recipe's own share of L_max."""
    if rc.overlong_buffer == 0 or (base is None and rc.overlong_buffer is None):
        if rc.overlong_factor is not None:
            raise ConfigError(f"recipe.overlong_factor = {rc.overlong_factor!r} is set but recipe {rc.name!r} has "
                              "no overlong penalty; valid: also set recipe.overlong_buffer (> 0)")
        return None
    buffer = rc.overlong_buffer or max(1, round(max_tokens * base.buffer / base.max_length))
    if buffer > max_tokens:
        raise ConfigError(f"recipe.overlong_buffer = {buffer} exceeds rollout.max_tokens = {max_tokens}; valid: "
                          f"0 (off) to {max_tokens}")
    factor = rc.overlong_factor if rc.overlong_factor is not None else (base.factor if base else 1.0)
    return core.OverlongPenalty(max_length=max_tokens, buffer=buffer, factor=factor)


def dynamic_sampling(cfg: Config) -> bool:
    """Whether the loop over-samples to fill the step with informative groups: rollout.dynamic_sampling,
    else the recipe's own choice."""
    if cfg.rollout.dynamic_sampling is not None:
        return cfg.rollout.dynamic_sampling
    return core.get_recipe(cfg.recipe.name).dynamic_sampling


def check_runnable(cfg: Config) -> None:
    """Raises ConfigError, naming the field, for a combination the RL loop cannot run."""
    plan_run(cfg)


def _check_batch_invariant(cfg: Config) -> None:
    """rollout.batch_invariant and train.reuse_sampler_logprobs: what bitwise on-policy sampling needs."""
    r, t = cfg.rollout, cfg.train
    if t.reuse_sampler_logprobs and not r.batch_invariant:
        raise ConfigError("train.reuse_sampler_logprobs = true needs rollout.batch_invariant = true (only then are the "
                          "sampler's log-probs pi_old's numbers); valid: set rollout.batch_invariant=true, or "
                          "train.reuse_sampler_logprobs=false")
    if t.reuse_sampler_logprobs and r.max_lag > 0:
        raise ConfigError(f"train.reuse_sampler_logprobs = true with rollout.max_lag = {r.max_lag}: a lagged batch was "
                          "sampled by older weights than pi_old; valid: rollout.max_lag=0")
    if not r.batch_invariant:
        return
    if r.engine != "jax":
        raise ConfigError(f"rollout.batch_invariant = true with rollout.engine = {r.engine!r}; valid: engine=jax "
                          "(the in-process sampler that shares the learner's code)")
    if r.top_p < 1.0 or r.top_k is not None:
        raise ConfigError(f"rollout.batch_invariant = true with rollout.top_p = {r.top_p}, top_k = {r.top_k}: the "
                          "learner scores the full softmax; valid: top_p=1.0 and top_k unset")
    learner_dtype = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[t.precision]
    if cfg.model.compute_dtype not in (None, learner_dtype):
        raise ConfigError(f"rollout.batch_invariant = true with model.compute_dtype = {cfg.model.compute_dtype!r} "
                          f"and train.precision = {t.precision!r}: sampler and learner must compute in one dtype; "
                          "valid: model.compute_dtype unset (it follows train.precision)")


def _check(cfg: Config, plan: RunPlan, recipe: core.Recipe) -> None:
    """`plan_run`'s refusals; `recipe` is the config's, before any staleness correction."""
    _check_batch_invariant(cfg)
    rc = cfg.recipe
    if isinstance(recipe.advantage_fn, core.GaeAdvantage) and recipe.value_coef <= 0:
        critic_recipes = [n for n, r in core.RECIPES.items() if r.value_coef > 0]
        raise ConfigError(
            f"recipe.advantage = 'gae' with recipe {rc.name!r} trains no critic (its value_coef is 0); valid: "
            f"recipe.name in {critic_recipes}, or another advantage")
    subset = getattr(getattr(recipe.advantage_fn, "estimator", None), "keywords", {}).get("k")  # pass@k
    if subset is not None and subset > cfg.rollout.samples_per_prompt:
        raise ConfigError(f"recipe.advantage = {rc.advantage or rc.name!r} scores subsets of {subset} answers, but "
                          f"rollout.samples_per_prompt = {cfg.rollout.samples_per_prompt}; valid: samples_per_prompt "
                          f">= {subset}, or a pass@k advantage with k <= {cfg.rollout.samples_per_prompt}")
    if plan.dynamic_sampling and plan.env_task:
        raise ConfigError("rollout.dynamic_sampling is not supported with a multi-turn environment task "
                          f"(task.name={cfg.task.name!r}, task.env={cfg.task.env!r}); valid: "
                          "rollout.dynamic_sampling=false")
    check_distill(cfg, recipe, plan.env_task)
    if plan.vineppo:
        _check_vineppo(cfg, plan, recipe)
    if plan.dynamic_sampling and cfg.rollout.samples_per_prompt < 2:
        raise ConfigError("rollout.dynamic_sampling is on with rollout.samples_per_prompt = 1: a group of one "
                          "answer always has accuracy 0 or 1, so no group could be kept; valid: "
                          "samples_per_prompt >= 2 or rollout.dynamic_sampling=false")
    sh = cfg.shaping
    for name, on in (("shaping.length_reward = 'kimi'", sh.length_reward == "kimi"),
                     (f"shaping.darling = {sh.darling!r}", sh.darling != "off")):
        if on and cfg.rollout.samples_per_prompt < 2:
            raise ConfigError(f"{name} compares the answers of a group, but rollout.samples_per_prompt = 1; "
                              "valid: samples_per_prompt >= 2")
    if sh.length_reward == "l1" and (not sh.l1_targets or max(sh.l1_targets) > cfg.rollout.max_tokens
                                     or min(sh.l1_targets) < 1):
        raise ConfigError(f"shaping.l1_targets = {sh.l1_targets!r} is invalid with rollout.max_tokens = "
                          f"{cfg.rollout.max_tokens}; valid: target lengths from 1 to {cfg.rollout.max_tokens}")


def _check_vineppo(cfg: Config, plan: RunPlan, recipe: core.Recipe) -> None:
    """VinePPO's values are means of the graders' rewards of continuations drawn by the weights
    that drew the responses; refuse what would break either."""
    why = "VinePPO's Monte-Carlo values (recipe.advantage = 'vineppo')"
    if cfg.rollout.max_lag > 0:
        raise ConfigError(f"rollout.max_lag = {cfg.rollout.max_lag} with {why}: the continuations must come from "
                          "the weights that sampled the responses; valid: rollout.max_lag=0")
    if cfg.shaping.length_reward != "off" or cfg.shaping.darling != "off":
        raise ConfigError(f"shaping.length_reward = {cfg.shaping.length_reward!r} / shaping.darling = "
                          f"{cfg.shaping.darling!r} with {why}: shaped rewards are group-level, a continuation "
                          "has none; valid: shaping.length_reward=off and shaping.darling=off")
    if recipe.overlong is not None:
        raise ConfigError(f"recipe.overlong_buffer = {cfg.recipe.overlong_buffer!r} (recipe {recipe.name!r}) with "
                          f"{why}: the values do not include the overlong penalty; valid: recipe.overlong_buffer=0")
    if plan.dynamic_sampling:
        raise ConfigError(f"rollout.dynamic_sampling is on with {why}: the values are estimated for one round of "
                          "prompts; valid: rollout.dynamic_sampling=false")
    if recipe.kl_beta > 0 and recipe.kl_mode == "reward":
        raise ConfigError(f"recipe.kl_mode = 'reward' with {why}: the values hold no per-token KL; valid: "
                          "recipe.kl_mode=loss")
    if recipe.value_coef > 0:
        raise ConfigError(f"recipe.name = {recipe.name!r} trains a critic (value_coef {recipe.value_coef}) with {why}, "
                          "which give no critic targets; valid: recipe.name=vineppo, or a recipe without a critic")
    if plan.env_task:
        raise ConfigError(f"task.name = {cfg.task.name!r} / task.env = {cfg.task.env!r} is a multi-turn environment, "
                          f"with {why}: a continuation would have to replay the environment; valid: a single-turn "
                          "task, or another advantage")


def _check_extra_inputs(cfg: Config, plan: RunPlan, recipe: core.Recipe, processes: int) -> None:
    """ReMax's greedy baseline and GDPO's per-grader rewards come from the plain sampling stage's
    grades of the graders' rewards; refuse what would change or lose them."""
    needs = getattr(recipe.advantage_fn, "inputs", ())
    if not {"baseline_rewards", "reward_parts"} & set(needs):
        return
    why = (f"recipe.advantage = {cfg.recipe.advantage or recipe.name!r} ("
           + ("ReMax: the greedy response's reward as the baseline)" if plan.greedy_baseline else
              "GDPO: each of task.reward_fns normalised within its group)"))
    refusals = (
        (plan.env_task, f"task.name = {cfg.task.name!r} / task.env = {cfg.task.env!r} is a multi-turn environment",
         "a single-turn task"),
        (plan.dynamic_sampling, "rollout.dynamic_sampling is on", "rollout.dynamic_sampling=false"),
        (cfg.shaping.length_reward != "off" or cfg.shaping.darling != "off",
         f"shaping.length_reward = {cfg.shaping.length_reward!r} / shaping.darling = {cfg.shaping.darling!r} shape "
         "the sampled rewards only", "shaping.length_reward=off and shaping.darling=off"),
        (recipe.overlong is not None, f"recipe.overlong_buffer = {cfg.recipe.overlong_buffer!r} (recipe "
         f"{recipe.name!r}) adds a penalty to the sampled rewards only", "recipe.overlong_buffer=0"),
        (processes > 1, f"the run has {processes} JAX processes (the step's gather carries no greedy or per-grader "
         "rewards)", "one process"),
        ("reward_parts" in needs and recipe.kl_beta > 0 and recipe.kl_mode == "reward",
         "recipe.kl_mode = 'reward' adds a per-token reward that is none of the graders'", "recipe.kl_mode=loss"),
    )
    for refused, what, valid in refusals:
        if refused:
            raise ConfigError(f"{what}, with {why}; valid: {valid}")
