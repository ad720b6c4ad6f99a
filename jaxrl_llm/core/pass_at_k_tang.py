"""Tang et al.'s pass@k advantage, verl's `grpo_passk` (docs/objectives.md#pass-at-k-advantages):
only the best response of each group is credited, by its margin over the second best.

  A_i = (r_(1) - r_(2)) / (std_g r + eps)   for i = the group's best response (r_(1) = max_g r)
  A_j = 0                                   for every other response j of the group

r_(2) is the second largest reward (a tie at the top gives 0), std the group's sample std
(ddof 1) and eps = 1e-6; without the std normalisation A_i = r_(1) - r_(2). With 0/1 rewards
the group's one credited response is a correct one exactly when the group has one correct
answer: the policy is pushed to make at least one of its k = G samples right (pass@G), not to
make each sample likelier right.

Source: Tang et al. 2025, "Optimizing Language Models for Inference Time Objectives using
Reinforcement Learning" (arXiv 2503.19595); verl's `compute_grpo_passk_outcome_advantage`
(verl/trainer/ppo/core_algos.py, volcengine/verl b178a3c). verl picks the best response with
torch.topk, whose order among equal rewards is unspecified; here the first in the group is the
best (jnp.argmax), and it gets 0 anyway since r_(1) = r_(2) then. Not the same estimator as
advantages.pass_at_k_advantages (Chen et al. 2025, arXiv 2508.10751: every response's mean
advantage over the size-k subsets that hold it; advantages "pass_at_2/4/8").
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.advantages import _check_ddof, _prepare_rewards, _safe_divide


def pass_at_k_tang_advantages(rewards, *, normalize_std: bool = True, ddof: int = 1,
                              eps: float = 1e-6) -> jax.Array:
    """[P, G] -> [P, G] float32 (module doc): the margin of each group's best reward over its
    second best on the best response, 0 on the others.

    Args:
      normalize_std: divide by std_g r + eps (verl's norm_adv_by_std_in_grpo, default on).
      ddof, eps: the group std's (verl: torch.std, ddof 1; eps 1e-6).
    Raises:
      ValueError for groups of fewer than 2 responses (no second best).
    """
    rewards = _prepare_rewards(rewards)
    group = rewards.shape[1]
    if group < 2:
        raise ValueError(f"pass_at_k_tang needs groups of at least 2 responses (a best and a second best), got "
                         f"G = {group}")
    _check_ddof(ddof, group, "samples per group")
    _checks.check_positive("eps", eps, allow_zero=True)
    top_two = jax.lax.top_k(rewards, 2)[0]
    margin = top_two[:, :1] - top_two[:, 1:]
    if normalize_std:
        margin = _safe_divide(margin, jnp.std(rewards, axis=1, ddof=ddof, keepdims=True) + eps)  # 0 on a tie
    best = jnp.arange(group)[None, :] == jnp.argmax(rewards, axis=1)[:, None]
    return jnp.where(best, margin, 0.0)
