"""ReMax: the reward of a greedy response to the same prompt as each group's baseline
(docs/objectives.md#remax-and-gdpo).

Source: Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning
Method for Aligning Large Language Models" (arXiv 2310.10505), Algorithm 1: the greedy
response is drawn by the same policy, graded like the sampled ones, and only its reward
enters the update. The RL loop draws it as one extra row per group (train/sample/stage.py);
`estimators.GreedyBaselineAdvantage` is the estimator a recipe names.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks, advantages as adv_lib


def remax_advantages(rewards, baseline_rewards) -> jax.Array:
    """A_pg = r_pg - b_p, with b_p the reward of the greedy response to prompt p.

    Args:
      rewards: [P, G] rewards of the sampled responses.
      baseline_rewards: [P] rewards of each prompt's greedy response.
    Returns:
      [P, G] float32.
    Raises:
      ValueError for non-finite rewards (when concrete) or a baseline that is not [P].
    """
    rewards = adv_lib._prepare_rewards(rewards)
    chex.assert_rank(baseline_rewards, 1)
    if jnp.shape(baseline_rewards)[0] != rewards.shape[0]:
        raise ValueError(f"baseline_rewards has {jnp.shape(baseline_rewards)[0]} entries for {rewards.shape[0]} "
                         "prompts; valid: one greedy reward per prompt, shape [P]")
    if _checks.is_concrete(baseline_rewards):
        adv_lib.validate_rewards(jnp.reshape(baseline_rewards, (-1, 1)))
    return rewards - _checks.to_float32(baseline_rewards)[:, None]
