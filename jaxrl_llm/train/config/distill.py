"""The on-policy distillation section of a run's config (`Config.distill`, re-exported by
train/config/schema.py) and its cross-field checks.

One mechanism: a recipe with a `core.Distillation` adds the teacher's per-token signal
log pi_T - log pi_old to its advantages (core/distill.py). `recipe.name=opd` is such a
recipe (reward_weight 0: distillation alone); `distill.teacher` on any other policy-gradient
recipe gives it the same term, its reward advantages weighted by `distill.reward_weight`
(default 1), e.g. GRPO plus a teacher.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING

from jaxrl_llm import core
from jaxrl_llm.utils.typed_config import ConfigError, Section, field

if TYPE_CHECKING:
    from jaxrl_llm.train.config.schema import Config

TEACHER_HELP = ("'smollm2', an HF directory (config.json, *.safetensors, tokenizer.json), a .gguf file, or a run "
                "directory (run_info.json; its latest checkpoint), with the student's tokenizer")


@dataclasses.dataclass(frozen=True)
class DistillConfig(Section):
    """On-policy distillation (recipe.name=opd, or a teacher on any recipe; train/run/teacher.py).
    The frozen teacher scores the sampled tokens in the learner's pi_old pass."""

    # The teacher: see TEACHER_HELP. None: no teacher (required by recipe.name=opd).
    teacher: str | None = None
    # Weight of the task reward's advantages next to the teacher's signal. None: the recipe's own
    # (opd: 0, distillation alone; any other recipe: 1).
    reward_weight: float | None = field(None, ge=0.0)
    _path_prefix = "distill."

    def _check_consistency(self) -> None:
        if self.teacher is None and self.reward_weight is not None:
            raise ConfigError(f"distill.reward_weight = {self.reward_weight!r} is set but distill.teacher is not; "
                              f"valid: also set distill.teacher ({TEACHER_HELP})")
        if self.teacher is not None and self.teacher != "smollm2" and not os.path.exists(self.teacher):
            raise ConfigError(f"distill.teacher = {self.teacher!r}: no such file or directory; valid: {TEACHER_HELP}")


def with_distillation(recipe: core.Recipe, section: DistillConfig) -> core.Recipe:
    """`recipe` with the teacher term the config asks for: opd keeps its own unless
    distill.reward_weight is set; any recipe gets one when distill.teacher is set."""
    if section.teacher is None:
        return recipe
    default = recipe.distill.reward_weight if recipe.distill is not None else 1.0
    weight = default if section.reward_weight is None else section.reward_weight
    return dataclasses.replace(recipe, distill=core.Distillation(reward_weight=weight))


def check_distill(cfg: Config, recipe: core.Recipe, env_task: bool) -> None:
    """Refuses, naming the field, a distillation the loop cannot run."""
    if recipe.distill is None:
        return
    if cfg.distill.teacher is None:
        raise ConfigError(f"recipe.name = {cfg.recipe.name!r} distils from a teacher, but distill.teacher is not "
                          f"set; valid: {TEACHER_HELP}")
    if recipe.value_coef > 0 or isinstance(recipe.advantage_fn, core.GaeAdvantage):
        raise ConfigError(f"distill.teacher with recipe.name = {cfg.recipe.name!r}, which trains a critic on the "
                          "task reward while the advantages carry the teacher's signal; valid: a recipe without a "
                          "critic (e.g. opd, grpo, rloo)")
    if isinstance(recipe.advantage_fn, core.MonteCarloAdvantage):
        raise ConfigError("distill.teacher with recipe.advantage = 'vineppo': the Monte-Carlo values are of the "
                          "task reward and come from extra rollouts; valid: another advantage (e.g. grpo)")
    if env_task:
        raise ConfigError(f"distill.teacher with the multi-turn environment task.name = {cfg.task.name!r} / "
                          f"task.env = {cfg.task.env!r}: not supported in this version (no test covers a teacher "
                          "scoring multi-turn episodes); valid: a single-turn task")
