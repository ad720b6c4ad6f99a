"""What the learner runs beside the policy: the reference policy, the distillation teacher and the
critic. The `Learner` holds one `SidePasses` and asks it for their weights, their checks and the
critic's update; the passes themselves run inside the Learner's one micro-batched pi_old program.

* Reference policy (recipe.kl_beta > 0; `train.learn.reference`): a compute-dtype copy of the
  initial params, taken at `Learner.init`; with LoRA the frozen base is the reference (no copy).
* Teacher (a recipe with `distill`; `train.run.teacher`): a frozen compute-dtype copy of the
  teacher's params, placed like the policy's, with its own DecoderConfig (any architecture).
* Critic (GAE advantages or value_coef > 0; `train.learn.critic`): a value head on the trunk's
  hidden states, its own optimiser, and a warm-up during which the critic alone is trained.
"""
from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import optax

from jaxrl_llm import core
from jaxrl_llm.train.learn import critic as critic_lib
from jaxrl_llm.train.learn import reference as reference_lib
from jaxrl_llm.train.learn.optimizer import masked_update
from jaxrl_llm.train.learn.placement import Placement


class SidePasses:
    """The reference, teacher and critic of one run (see the module docstring)."""

    def __init__(self, recipe: core.Recipe, compute_dtype, place: Placement, *, critic_cfg=None, teacher=None):
        self.recipe_name = recipe.name
        self.compute_dtype = jnp.dtype(compute_dtype)
        self.place = place  # the Learner's: the reference and the teacher sit like the policy's params
        self.needs_reference = recipe.kl_beta > 0
        self.reference = None  # full fine-tuning with a KL term: the compute-dtype initial params, set by init
        self.needs_critic = isinstance(recipe.advantage_fn, core.GaeAdvantage) or recipe.value_coef > 0
        if self.needs_critic and (critic_cfg is None or recipe.value_coef <= 0):
            raise ValueError(f"recipe {recipe.name!r} needs a critic: pass critic_cfg (the config's critic "
                             f"section) and a recipe with value_coef > 0 (got {recipe.value_coef})")
        self.distills = recipe.distill is not None
        self.critic_cfg = critic_cfg
        self.critic_optimizer = critic_lib.make_critic_optimizer(critic_cfg) if self.needs_critic else None
        # The teacher (a train.run.teacher.Teacher): only its compute-dtype copy is kept, placed like the params.
        dtype = self.compute_dtype.name
        self.teacher_cfg = None if teacher is None else teacher.cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
        self.teacher_params = None if teacher is None else reference_lib.reference_copy(
            place.params(teacher.params), self.compute_dtype)

    def init_passes(self, params, *, base_is_reference: bool, hidden_size: int) -> critic_lib.CriticState | None:
        """At `Learner.init`: keeps the compute-dtype copy of the initial float32 `params` when the recipe
        has a KL term (none when `base_is_reference`: LoRA's frozen base is the reference), and returns a
        fresh value head and its optimiser state (None without a critic)."""
        if self.needs_reference and not base_is_reference:
            self.reference = reference_lib.reference_copy(self.place.params(params), self.compute_dtype)
        if not self.needs_critic:
            return None
        head = critic_lib.init_critic_params(hidden_size)
        return critic_lib.CriticState(head, self.critic_optimizer.init(head))

    def check(self, *, with_reference: bool, with_teacher: bool, frozen: Any) -> None:
        """Refuses a pi_old pass that asks for a part this run does not hold."""
        if with_teacher and self.teacher_params is None:
            raise ValueError(f"recipe {self.recipe_name!r} distils from a teacher: pass teacher= (train.teacher."
                             "load_teacher) to the Learner")
        if with_reference and self.reference is None and frozen is None:
            raise ValueError("no reference policy: the learner keeps one when recipe.kl_beta > 0 (or with LoRA, "
                             "whose frozen base is the reference); call init first")

    def update_critic(self, critic: critic_lib.CriticState, grads, finite, step):
        """The critic's optimiser step inside the Learner's update: returns (new critic state, whether the
        policy updates this step, finite after the critic's gradient, metrics). During
        `critic.warmup_steps` the policy is held and the critic alone trains."""
        critic_norm = optax.tree.norm(grads)
        finite = finite & jnp.isfinite(critic_norm)
        policy_on = finite & (step >= self.critic_cfg.warmup_steps)
        new = critic_lib.CriticState(*masked_update(self.critic_optimizer, critic.params, critic.opt_state, grads,
                                                    finite))
        metrics = {"critic_grad_norm": critic_norm, "policy_held": (finite & ~policy_on).astype(jnp.float32)}
        return new, policy_on, finite, metrics

    @property
    def reference_bytes(self) -> int:
        """Extra memory the reference policy costs: its copy of the weights in the compute
        dtype, or 0 (no KL term, or LoRA, whose frozen base is the reference)."""
        return reference_lib.tree_bytes(self.reference)

    @property
    def teacher_bytes(self) -> int:
        """Memory the distillation teacher costs: its weights in the compute dtype (0 without one)."""
        return reference_lib.tree_bytes(self.teacher_params)
