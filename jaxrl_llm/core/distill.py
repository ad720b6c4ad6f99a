"""On-policy distillation (OPD): a frozen teacher scores the student's own samples
(docs/objectives.md#on-policy-distillation).

The student pi_S samples y ~ pi_S(. | x); the teacher pi_T scores the same tokens. The
per-token reverse KL KL(pi_S || pi_T) at position t, estimated on the sampled token, is
log pi_S(y_t | x, y_<t) - log pi_T(y_t | x, y_<t); its negation is the token's advantage

    A_t = log pi_T(y_t | ...) - log pi_S(y_t | ...)          (detached constants)

so a policy-gradient step lowers the reverse KL to the teacher, token by token (dense
credit, no reward model). With `reward_weight` w > 0 the recipe's own reward advantages
are mixed in: A_t = w * A_reward_t + (log pi_T - log pi_S)_t.

Sources: Agarwal et al. 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD, arXiv 2306.13649), whose lambda = 1, beta = 1 point is
this on-policy reverse KL; Lu et al. 2025 (Thinking Machines Lab), "On-Policy
Distillation", which uses the negated per-token reverse KL as the advantage of an
importance-sampled policy-gradient loss.

Pure functions; every array [N, T] float, the mask [N, T]; positions outside the mask
are 0 in value and gradient.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks


@dataclasses.dataclass(frozen=True)
class Distillation:
    """A recipe's teacher term: token advantages get log pi_T - log pi_S added, the
    recipe's reward advantages scaled by `reward_weight` (0: distillation alone)."""

    reward_weight: float = 0.0

    def __post_init__(self):
        _checks.check_positive("reward_weight", self.reward_weight, allow_zero=True)


def reverse_kl_advantages(teacher_logp, student_logp, mask) -> jax.Array:
    """A_t = log pi_T - log pi_S per sampled token, 0 outside `mask`; both inputs are
    constants (stop_gradient). Shapes [N, T]; returns float32 [N, T]."""
    _checks.check_float(teacher_logp, 2)
    _checks.check_float(student_logp, 2)
    _checks.check_same_shape(teacher_logp=teacher_logp, student_logp=student_logp, mask=mask)
    valid = _checks.valid_tokens(mask)
    teacher = _checks.masked_zero(jax.lax.stop_gradient(_checks.to_float32(teacher_logp)), valid)
    student = _checks.masked_zero(jax.lax.stop_gradient(_checks.to_float32(student_logp)), valid)
    return jnp.where(valid, teacher - student, 0.0)


def distill_advantages(reward_advantages, teacher_logp, student_logp, mask, *, reward_weight: float) -> jax.Array:
    """w * A_reward + (log pi_T - log pi_S) per token, 0 outside `mask` ([N, T] float32)."""
    _checks.check_positive("reward_weight", reward_weight, allow_zero=True)
    signal = reverse_kl_advantages(teacher_logp, student_logp, mask)
    if reward_weight == 0:  # 0 * A_reward would still carry a NaN or inf from it
        return signal
    valid = _checks.valid_tokens(mask)
    return signal + jnp.where(valid, reward_weight * _checks.to_float32(reward_advantages), 0.0)


def reverse_kl_mean(teacher_logp, student_logp, mask) -> jax.Array:
    """Token mean over `mask` of log pi_S - log pi_T: the sampled estimate of the reverse KL
    KL(pi_S || pi_T) per token (0 for an empty mask)."""
    valid = _checks.valid_tokens(mask)
    gap = -reverse_kl_advantages(teacher_logp, student_logp, mask)
    return jnp.sum(gap) / jnp.maximum(jnp.sum(valid), 1)


def reverse_kl_abs_max(teacher_logp, student_logp, mask) -> jax.Array:
    """max over `mask` of |log pi_T - log pi_S| (0 for an empty mask): 0 exactly when the
    distillation signal is 0 at every token."""
    return jnp.max(jnp.abs(reverse_kl_advantages(teacher_logp, student_logp, mask)), initial=0.0)
