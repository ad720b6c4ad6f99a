"""The recipe section of a run's config (`Config.recipe`, re-exported by train/config.py)."""

from __future__ import annotations

import dataclasses

from jaxrl_llm import core
from jaxrl_llm.utils.typed_config import Section, field

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
    advantage: str | None = field(None, choices=ADVANTAGE_NAMES)
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
    correction_cap: float | None = field(None, gt=0.0)
    filter_zero_variance_groups: bool | None = None
    # DAPO soft overlong punishment (Yu et al. 2025, eq. 13): a ramp from 0 to -overlong_factor
    # over the last overlong_buffer tokens before rollout.max_tokens. None: the recipe's own
    # (dapo: 20% of max_tokens, as 4096 of 20480 in the paper); 0: off.
    overlong_buffer: int | None = field(None, ge=0)
    overlong_factor: float | None = field(None, ge=0.0)
    # DAPO overlong filtering: truncated responses (no EOS) leave the loss. None: the recipe's own.
    mask_truncated: bool | None = None
    # Hyperparameters of one loss each; None: the recipe's or the loss's own. Set with another loss,
    # the config is refused (train/runnable.py). DPPO's trust-region radius delta (dppo_tv: 0.15, dppo_kl: 0.05).
    dppo_threshold: float | None = field(None, gt=0.0)
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
