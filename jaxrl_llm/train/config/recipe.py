"""The recipe section of a run's config (`Config.recipe`, re-exported by train/config/schema.py), and
`recipe_from_config`: the `core.Recipe` a config names, with its overrides."""

from __future__ import annotations

import dataclasses
import inspect
from typing import TYPE_CHECKING

from jaxrl_llm import core
from jaxrl_llm.train.config.distill import with_distillation
from jaxrl_llm.utils.typed_config import ConfigError, Section, field

if TYPE_CHECKING:  # schema.py imports this module for RecipeConfig
    from jaxrl_llm.train.config.schema import Config

# Names come from core's registries, so a config can only name what the learner has.
RECIPE_NAMES = tuple(core.RECIPES)
AGGREGATION_NAMES = tuple(core.AGGREGATION_MODES)
POLICY_LOSS_NAMES = tuple(core.POLICY_LOSSES)
KL_ESTIMATOR_NAMES = tuple(core.KL_ESTIMATORS)
CORRECTION_NAMES = ("off", *core.CORRECTIONS)  # "off": no correction, whatever the recipe says
ADVANTAGE_NAMES = tuple(core.ADVANTAGES)


@dataclasses.dataclass(frozen=True)
class RecipeConfig(Section):
    """A named objective (core's recipe registry) plus optional overrides.

    None means "whatever the recipe defines"; a value replaces that part.
    """

    name: str = field("grpo", choices=RECIPE_NAMES)
    # choices: the live registry, so an estimator registered at run time (a plugin, a test) is valid
    advantage: str | None = field(None, choices=core.ADVANTAGES)
    loss: str | None = field(None, choices=POLICY_LOSS_NAMES)
    aggregation: str | None = field(None, choices=AGGREGATION_NAMES)
    # L_const of the "constant" aggregation; None: rollout.max_tokens.
    constant_length: int | None = field(None, ge=1)
    eps_low: float | None = field(None, ge=0.0, lt=1.0)
    eps_high: float | None = field(None, ge=0.0)
    dual_clip_c: float | None = field(None, gt=1.0)
    kl_beta: float | None = field(None, ge=0.0)
    kl_estimator: str | None = field(None, choices=KL_ESTIMATOR_NAMES)
    # "loss": beta * KL in the loss; "reward": -beta * k_t (pi_old vs reference) in the rewards.
    kl_mode: str | None = field(None, choices=tuple(core.KL_MODES))
    correction: str | None = field(None, choices=CORRECTION_NAMES)
    # The correction's bounds; None: the correction's own. correction_cap: C of token/sequence TIS,
    # sequence MIS and decoupled_ppo (AReaL's cap, 5); correction_low / correction_high: the ratio window
    # of token_mis (0.5, 5), seq_mask_tis (0.999, 1.002) and geometric_sequence_rejection (no default).
    # Set with a correction that has no such bound, or low > high, the config is refused.
    correction_cap: float | None = field(None, gt=0.0)
    correction_low: float | None = field(None, gt=0.0)
    correction_high: float | None = field(None, gt=0.0)
    filter_zero_variance_groups: bool | None = None
    # DAPO soft overlong punishment (Yu et al. 2025, eq. 13): a ramp from 0 to -overlong_factor
    # over the last overlong_buffer tokens before rollout.max_tokens. None: the recipe's own
    # (dapo: 20% of max_tokens, as 4096 of 20480 in the paper); 0: off.
    overlong_buffer: int | None = field(None, ge=0)
    overlong_factor: float | None = field(None, ge=0.0)
    # DAPO overlong filtering: truncated responses (no EOS) leave the loss. None: the recipe's own.
    mask_truncated: bool | None = None
    # Hyperparameters of one loss each; None: the recipe's or the loss's own. Set with another loss,
    # the config is refused (train/plan.py). DPPO's trust-region radius delta (dppo_tv: 0.15, dppo_kl: 0.05),
    # and the radii for updates that lower / raise the token's probability (None: dppo_threshold).
    dppo_threshold: float | None = field(None, gt=0.0)
    dppo_threshold_low: float | None = field(None, gt=0.0)
    dppo_threshold_high: float | None = field(None, gt=0.0)
    # SAPO's gate temperatures for A > 0 and A <= 0 (1.0 and 1.05).
    sapo_tau_pos: float | None = field(None, gt=0.0)
    sapo_tau_neg: float | None = field(None, gt=0.0)
    # Clip-Cov / KL-Cov: the share of the step's tokens picked by covariance (2e-4), Clip-Cov's
    # covariance band (1, 5), KL-Cov's penalty weight (1).
    cov_fraction: float | None = field(None, gt=0.0, le=1.0)
    clip_cov_lower: float | None = None
    clip_cov_upper: float | None = None
    kl_cov_coef: float | None = field(None, ge=0.0)
    _path_prefix = "recipe."


def recipe_from_config(cfg: Config) -> core.Recipe:
    """`core.get_recipe(cfg.recipe.name)` with the config's explicit overrides (None keeps
    the recipe's own choice), through `core.customize_recipe`. The constant aggregation's
    L_const defaults to rollout.max_tokens."""
    rc = cfg.recipe
    base = core.get_recipe(rc.name)
    _check_loss_fields(rc, base)
    _check_correction_fields(rc, base)
    recipe = core.customize_recipe(
        base, advantage=rc.advantage, loss=rc.loss, aggregation=rc.aggregation,
        constant_length=rc.constant_length, eps_low=rc.eps_low, eps_high=rc.eps_high, dual_clip=rc.dual_clip_c,
        kl_beta=rc.kl_beta, kl_estimator=rc.kl_estimator, kl_mode=rc.kl_mode, correction=rc.correction,
        correction_cap=rc.correction_cap, correction_params=_set_values(rc, CORRECTION_FIELDS),
        filter_zero_variance_groups=rc.filter_zero_variance_groups,
        loss_params=_set_values(rc, LOSS_FIELDS), selection_params=_set_values(rc, SELECTION_FIELDS))
    if isinstance(recipe.advantage_fn, core.MultiRewardAdvantage) and cfg.task.reward_weights:
        recipe = dataclasses.replace(recipe, advantage_fn=core.MultiRewardAdvantage(tuple(cfg.task.reward_weights)))
    if recipe.aggregation == "constant" and recipe.constant_length is None:
        recipe = dataclasses.replace(recipe, constant_length=cfg.rollout.max_tokens)
    if rc.mask_truncated is not None:
        recipe = dataclasses.replace(recipe, mask_truncated=rc.mask_truncated)
    recipe = dataclasses.replace(recipe, overlong=_overlong(recipe.overlong, rc, cfg.rollout.max_tokens))
    return with_distillation(recipe, cfg.distill)


# recipe.<field> -> the keyword it binds on the policy loss / on the token selection (Clip-Cov, KL-Cov).
LOSS_FIELDS = {"eps_low": "eps_low", "eps_high": "eps_high", "dual_clip_c": "dual_clip", "dppo_threshold": "threshold",
               "dppo_threshold_low": "threshold_low", "dppo_threshold_high": "threshold_high",
               "sapo_tau_pos": "tau_pos", "sapo_tau_neg": "tau_neg", "kl_cov_coef": "kl_coef"}
SELECTION_FIELDS = {"cov_fraction": "fraction", "clip_cov_lower": "lower", "clip_cov_upper": "upper"}
# recipe.<field> -> the keyword it binds on the correction (correction_cap is customize_recipe's own argument).
CORRECTION_FIELDS = {"correction_low": "low", "correction_high": "high"}
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


def _check_correction_fields(rc: RecipeConfig, base: core.Recipe) -> None:
    """Refuses, naming the field, a correction bound that the run's correction does not take (e.g.
    recipe.correction_low with token_tis) and a window with low > high."""
    if rc.correction == "off":
        return  # customize_recipe refuses bounds with the correction off
    fn, bound = (core.CORRECTIONS[rc.correction], {}) if rc.correction else (
        getattr(base.correction, "func", base.correction), dict(getattr(base.correction, "keywords", {})))
    if fn is None:
        return  # customize_recipe refuses bounds without a correction
    name = next(n for n, f in core.CORRECTIONS.items() if f is fn)
    params = inspect.signature(fn).parameters
    for field_name, keyword in {"correction_cap": "cap", **CORRECTION_FIELDS}.items():
        value = getattr(rc, field_name)
        if value is not None and keyword not in params:
            takes = [n for n, f in core.CORRECTIONS.items() if keyword in inspect.signature(f).parameters]
            raise ConfigError(f"recipe.{field_name} = {value!r} is set, but the run's correction {name!r} has no "
                              f"{keyword!r}; valid: recipe.correction in {takes}, or leave recipe.{field_name} unset")
    if "low" in params and "high" in params:
        low, high = (rc.correction_low, rc.correction_high)
        low = low if low is not None else bound.get("low", params["low"].default)
        high = high if high is not None else bound.get("high", params["high"].default)
        if inspect.Parameter.empty in (low, high):
            raise ConfigError(f"recipe.correction = {name!r} has no default window; valid: set both "
                              "recipe.correction_low and recipe.correction_high (0 < low <= high)")
        if low > high:
            raise ConfigError(f"recipe.correction_low = {low!r} > recipe.correction_high = {high!r} for correction "
                              f"{name!r}; valid: 0 < correction_low <= correction_high")


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
