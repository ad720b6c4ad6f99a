"""GPG, Group Policy Gradient (docs/objectives.md#gpg): REINFORCE on the group-centred reward,
rescaled for the responses whose advantage is 0.

  A_i = alpha (r_i - mean_g r) / F_norm,   alpha = B / (B - M)

B is the number of responses in the step batch, M the number in groups whose rewards are all
equal (their advantage is exactly 0, so they add nothing to the gradient but still count in a
token-mean denominator): alpha restores the gradient's scale to that of the informative
responses alone ("accurate gradient estimation"). F_norm = 1 is the paper's default (advantage
"gpg"); its std-normalised option F_norm = std_g r + eps (ddof 1, eps 1e-6 as GRPO's here,
advantage "gpg_std") is GRPO's advantage times alpha. The loss is the plain policy gradient
-A log pi with token-mean aggregation (recipe "gpg").

Source: Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning Baseline for Model
Reasoning" (arXiv 2504.02546). verl's `compute_gpg_outcome_advantage` instead takes M as the
number of zero rewards; we follow the paper.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core.advantages import _group_centred, _prepare_rewards, grpo_advantages


def gpg_advantages(rewards, *, normalize_std: bool = False, ddof: int = 1, eps: float = 1e-6) -> jax.Array:
    """[P, G] -> [P, G] float32 GPG advantages (module doc); all 0 when every group is constant.

    Call it on the WHOLE step batch: alpha counts the batch's zero-variance groups.

    Args:
      normalize_std: F_norm = std_g r + eps (the paper's std-normalised option) instead of 1.
      ddof, eps: the group std's, used only with normalize_std (as grpo_advantages').
    """
    rewards = _prepare_rewards(rewards)
    centred = _group_centred(rewards)
    if normalize_std:
        centred = grpo_advantages(rewards, ddof=ddof, eps=eps)  # 0 exactly where the group is constant
    informative = jnp.any(centred != 0, axis=1, keepdims=True)
    total = rewards.size
    active = jnp.sum(jnp.broadcast_to(informative, rewards.shape))
    alpha = total / jnp.maximum(active, 1)
    return alpha * centred
