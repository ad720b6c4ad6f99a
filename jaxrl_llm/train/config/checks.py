"""The cross-field checks of a run's config: they refuse, naming the field, a combination the RL
loop cannot run (e.g. GAE advantages without a critic loss, dynamic sampling with groups of one,
VinePPO on an environment). Every `Config` runs `check_runnable` when it is built (without the
task object: the config's task section decides whether it is an environment); the run planner
(train/plan.py) runs it again with the task object the loop built. `check_policy_fields` refuses
what needs the policy's architecture (a mixture-of-experts option on a dense policy); the learner
and the rollout engine run it when they are built from a config (`make_learner`, `make_engine`).

`RunFacts` are the facts of a run that follow from its config alone; the planner builds the
`RunPlan` from them. Nothing here imports the planner.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from jaxrl_llm import core
from jaxrl_llm.train.config.distill import check_distill
from jaxrl_llm.train.config.recipe import recipe_from_config
from jaxrl_llm.train.config.task import is_env_task
from jaxrl_llm.utils.typed_config import ConfigError

if TYPE_CHECKING:  # schema.py imports this module to check every Config it builds
    from jaxrl_llm.train.config.schema import Config


# The fields only a mixture-of-experts policy can use: (section, field, the value a dense policy must leave).
MOE_ONLY_FIELDS = (("train", "router_aux_loss_coef", 0.0), ("train", "router_z_loss_coef", 0.0),
                   ("train", "routing_replay", "off"), ("rollout", "return_routed_experts", False))


def _shown(value) -> str:
    """A value as an override writes it: true / false for bools, repr otherwise."""
    return str(value).lower() if isinstance(value, bool) else repr(value)


def check_policy_fields(model_cfg, **sections) -> None:
    """ConfigError naming the first of `MOE_ONLY_FIELDS` set on a dense policy (`model_cfg`, a
    `models.DecoderConfig`), with the policy's architecture and the valid value; `sections`: the
    config's sections by name (train=..., rollout=...), only those given are checked."""
    if model_cfg.is_moe:
        return
    for section, name, dense_value in MOE_ONLY_FIELDS:
        if section in sections and getattr(sections[section], name) != dense_value:
            field = f"{section}.{name}"
            raise ConfigError(f"{field}={_shown(getattr(sections[section], name))} needs a mixture-of-experts policy; "
                              f"the policy is {model_cfg.architecture} (dense); valid: {field}={_shown(dense_value)}")


class RunFacts(NamedTuple):
    """What a config decides about its run, before any planning."""

    recipe: core.Recipe  # the config's recipe (before any staleness correction)
    dynamic_sampling: bool  # over-sample prompt rounds until the step holds informative groups
    env_task: bool  # a multi-turn environment: a step's groups are episodes
    vineppo: bool  # Monte-Carlo values: K continuations per chunk start after grading
    greedy_baseline: bool  # ReMax: the job also draws one greedy response per prompt


def run_facts(cfg: Config, env_task: bool | None = None) -> RunFacts:
    """The facts of `cfg`'s run; `env_task` None: the task section decides it. A recipe the
    config cannot build raises ConfigError naming the recipe section."""
    try:
        recipe = recipe_from_config(cfg)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(f"recipe: {err}") from None
    return RunFacts(
        recipe=recipe, dynamic_sampling=dynamic_sampling(cfg),
        env_task=is_env_task(cfg.task) if env_task is None else env_task,
        vineppo=isinstance(recipe.advantage_fn, core.MonteCarloAdvantage),
        greedy_baseline=isinstance(recipe.advantage_fn, core.GreedyBaselineAdvantage))


def check_runnable(cfg: Config, *, env_task: bool | None = None, processes: int = 1) -> RunFacts:
    """Raises ConfigError, naming the field, for a combination the RL loop cannot run; returns the
    run's facts (`env_task`: whether the task object is an environment, None: the config says)."""
    facts = run_facts(cfg, env_task)
    _check(cfg, facts, facts.recipe)
    _check_extra_inputs(cfg, facts, facts.recipe, processes)
    return facts


def dynamic_sampling(cfg: Config) -> bool:
    """Whether the loop over-samples to fill the step with informative groups: rollout.dynamic_sampling,
    else the recipe's own choice."""
    if cfg.rollout.dynamic_sampling is not None:
        return cfg.rollout.dynamic_sampling
    return core.get_recipe(cfg.recipe.name).dynamic_sampling


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


def _check_sampler_mesh(cfg: Config) -> None:
    """rollout.mesh (the JAX sampler's own mesh) with an engine or a mode that cannot use it; sizes against the
    devices are checked where the sampler is made (`train.distributed.sampler_mesh_of`)."""
    r = cfg.rollout
    if not r.mesh.enabled:
        return
    given = " ".join(f"rollout.mesh.{k}={v}" for k, v in (("data", r.mesh.data), ("tensor", r.mesh.tensor))
                     if v is not None)
    if r.engine != "jax":
        raise ConfigError(f"{given} with rollout.engine = {r.engine!r}: the mesh is the JAX sampler's; valid: "
                          "rollout.engine=jax, or leave rollout.mesh unset (a vLLM server has its own "
                          "--tensor-parallel-size)")
    if r.batch_invariant:
        raise ConfigError(f"{given} with rollout.batch_invariant = true: batch-invariant sampling runs on one device; "
                          "valid: leave rollout.mesh unset, or rollout.batch_invariant=false")


def _check_routing_replay(cfg: Config) -> None:
    """train.routing_replay='sampler' needs the engine's routing records, which either engine returns only
    with rollout.return_routed_experts (a dense policy is refused when the learner is built:
    `train.learn.routing_replay.check_routing_replay` names its architecture)."""
    r = cfg.rollout
    if cfg.train.routing_replay == "sampler" and not r.return_routed_experts:
        raise ConfigError(f"train.routing_replay = 'sampler' with rollout.engine = {r.engine!r} needs the sampler's "
                          "routing records, and rollout.return_routed_experts = false; valid: "
                          "rollout.return_routed_experts=true, or train.routing_replay=off")


def _check(cfg: Config, plan: RunFacts, recipe: core.Recipe) -> None:
    """`plan_run`'s refusals; `recipe` is the config's, before any staleness correction."""
    _check_batch_invariant(cfg)
    _check_sampler_mesh(cfg)
    _check_routing_replay(cfg)
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
    _check_off_policy(cfg, recipe)
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


def _check_off_policy(cfg: Config, recipe: core.Recipe) -> None:
    """Decoupled PPO and seq-mask-tis weigh by pi_old / mu: refused where the learner's pi_old IS the
    sampler's mu; Tang et al.'s pass@k advantage needs a second-best answer in each group."""
    correction = getattr(recipe.correction, "func", recipe.correction)
    name = next((n for n, f in core.off_policy.CORRECTIONS.items() if f is correction), None)
    if name is not None and cfg.train.reuse_sampler_logprobs:
        raise ConfigError(f"recipe.correction = {name!r} weighs by pi_old / mu, but train.reuse_sampler_logprobs = "
                          "true makes pi_old the sampler's log-probs (every weight 1); valid: "
                          "train.reuse_sampler_logprobs=false, or recipe.correction=off")
    estimator = getattr(recipe.advantage_fn, "estimator", None)
    if getattr(estimator, "func", estimator) is core.pass_at_k_tang_advantages and cfg.rollout.samples_per_prompt < 2:
        raise ConfigError(f"recipe.advantage = 'grpo_passk' credits each group's best answer over its second best, but "
                          f"rollout.samples_per_prompt = {cfg.rollout.samples_per_prompt}; valid: samples_per_prompt >= 2")


def _check_vineppo(cfg: Config, plan: RunFacts, recipe: core.Recipe) -> None:
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


def _check_extra_inputs(cfg: Config, plan: RunFacts, recipe: core.Recipe, processes: int) -> None:
    """An estimator's extra inputs (its `inputs`: ReMax's greedy baseline, GDPO's per-grader rewards,
    any train/sample/extras.py fills) come from the plain sampling stage's grades of the graders'
    rewards, in one process; refuse what would change or lose them (VinePPO's own refusals ran first)."""
    needs = core.estimator_inputs(recipe)
    if not needs:
        return
    why = f"recipe.advantage = {cfg.recipe.advantage or recipe.name!r} (its estimator takes {list(needs)})"
    refusals = (
        (plan.env_task, f"task.name = {cfg.task.name!r} / task.env = {cfg.task.env!r} is a multi-turn environment",
         "a single-turn task"),
        (plan.dynamic_sampling, "rollout.dynamic_sampling is on", "rollout.dynamic_sampling=false"),
        (cfg.shaping.length_reward != "off" or cfg.shaping.darling != "off",
         f"shaping.length_reward = {cfg.shaping.length_reward!r} / shaping.darling = {cfg.shaping.darling!r} shape "
         "the sampled rewards only", "shaping.length_reward=off and shaping.darling=off"),
        (recipe.overlong is not None, f"recipe.overlong_buffer = {cfg.recipe.overlong_buffer!r} (recipe "
         f"{recipe.name!r}) adds a penalty to the sampled rewards only", "recipe.overlong_buffer=0"),
        (processes > 1, f"the run has {processes} JAX processes (the step's gather carries no extra inputs)",
         "one process"),
        (isinstance(recipe.advantage_fn, core.MultiRewardAdvantage) and recipe.kl_beta > 0
         and recipe.kl_mode == "reward", "recipe.kl_mode = 'reward' adds a per-token reward that is none of the "
         "graders'", "recipe.kl_mode=loss"),
    )
    for refused, what, valid in refusals:
        if refused:
            raise ConfigError(f"{what}, with {why}; valid: {valid}")
