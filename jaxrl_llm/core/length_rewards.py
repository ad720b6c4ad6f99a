"""Length-control rewards, added to the task reward (docs/objectives.md#length-control-rewards).

Both are pure functions of response lengths (and correctness); the RL loop adds
weight x reward to the graders' rewards before the advantages. DAPO's soft
overlong punishment, the third length shaping, is `filters.overlong_penalty`.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks


def l1_length_reward(lengths, targets, *, alpha: float) -> jax.Array:
    """L1 / LCPO-Exact length term: r_len = -alpha |n_target - n_y|.

    Aggarwal and Welleck 2025, "L1: Controlling How Long A Reasoning Model Thinks
    With Reinforcement Learning" (arXiv 2503.04697), eq. 1: the prompt states a
    target n_target ("Think for n_target tokens.") and the reward is
    1[y correct] - alpha |n_target - n_y| (alpha = 0.0003 in the paper); this
    function is the second term.

    Args:
      lengths: response lengths n_y, any shape.
      targets: target lengths, broadcastable to `lengths`.
      alpha: >= 0, the penalty per token of deviation.
    Returns:
      float32 rewards (<= 0) of the broadcast shape.
    """
    _checks.check_positive("alpha", alpha, allow_zero=True)
    lengths, targets = _checks.to_float32(lengths), _checks.to_float32(targets)
    return -alpha * jnp.abs(targets - lengths)


def kimi_length_reward(lengths, correct) -> jax.Array:
    """Kimi k1.5 length reward within each group of answers to one prompt.

    lambda_i = 0.5 - (len_i - min_len) / (max_len - min_len)
    r_len_i  = lambda_i              if answer i is correct
             = min(0, lambda_i)      if it is incorrect

    min_len and max_len are over the group's G answers (right and wrong); a group
    whose answers all have one length gets 0 (the ratio is undefined). Correct
    answers are pushed towards the shortest, and long wrong answers are penalised
    while short wrong ones are not rewarded. Source: Kimi Team 2025, "Kimi k1.5:
    Scaling Reinforcement Learning with LLMs" (arXiv 2501.12599), section 2.3.3,
    where the term is added to the reward with a weight warmed up during training.

    Args:
      lengths: [P, G] response lengths.
      correct: [P, G] bool (or 0/1) correctness.
    Returns:
      [P, G] float32 in [-0.5, 0.5].
    """
    chex.assert_rank(lengths, 2)
    lengths = _checks.to_float32(lengths)
    _checks.check_same_shape(lengths=lengths, correct=correct)
    shortest = jnp.min(lengths, axis=1, keepdims=True)
    spread = jnp.max(lengths, axis=1, keepdims=True) - shortest
    lam = jnp.where(spread > 0, 0.5 - (lengths - shortest) / jnp.where(spread > 0, spread, 1.0), 0.0)
    return jnp.where(jnp.asarray(correct, bool), lam, jnp.minimum(0.0, lam))
