"""Bias diagnostics as pure functions (docs/objectives.md#length-bias, #difficulty-bias).

For the policy-gradient loss l_it = -A_i log pi_it aggregated with weights
w_it, d L / d log pi_it = -w_it A_i. The "implied per-token gradient weight"
w_it A_i shows each aggregation mode's length bias as a number, and the
difficulty weight shows how std normalisation re-weights prompts.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks, aggregation


def implied_token_weight(
    lengths,
    advantages,
    mode: str,
    *,
    num_responses,
    total_tokens=None,
    constant_length: float | None = None,
) -> jax.Array:
    """w_it A_i for a valid token of a response of length L_i, per mode.

      seq_mean_token_mean   A_i / (N L_i)
      token_mean            A_i / total_tokens      (total_tokens = sum_j L_j by default)
      seq_mean_token_sum    A_i / N
      constant              A_i / (N L_const)

    The push the policy-gradient loss gives log pi_it (its negative gradient).
    Source: Liu et al. 2025, Dr. GRPO (arXiv 2503.20783), section 3.1.

    Args:
      lengths: [N] response lengths L_i (0 gives weight 0).
      advantages: [N] A_i.
      mode: one of aggregation.AGGREGATION_MODES.
      num_responses: N of the step batch.
      total_tokens: sum of L over the step batch (token_mean only).
      constant_length: L_const (constant only).
    Returns:
      [N] float32.
    """
    aggregation.check_mode(mode)
    chex.assert_rank(lengths, 1)
    chex.assert_rank(advantages, 1)
    _checks.check_same_shape(lengths=lengths, advantages=advantages)
    _checks.check_positive("num_responses", num_responses)
    lengths = _checks.to_float32(lengths)
    advantages = _checks.to_float32(advantages)
    has_tokens = lengths > 0
    if mode == "seq_mean_token_mean":
        per_token = 1.0 / (num_responses * jnp.where(has_tokens, lengths, 1.0))
    elif mode == "token_mean":
        total = jnp.sum(lengths) if total_tokens is None else jnp.float32(total_tokens)
        per_token = 1.0 / jnp.maximum(total, 1.0)
    elif mode == "seq_mean_token_sum":
        per_token = jnp.full_like(lengths, 1.0 / num_responses)
    else:
        if constant_length is None:
            raise ValueError("mode 'constant' needs constant_length (L_const)")
        _checks.check_positive("constant_length", constant_length)
        per_token = jnp.full_like(lengths, 1.0 / (num_responses * constant_length))
    return jnp.where(has_tokens, per_token * advantages, 0.0)


def implied_sequence_weight(lengths, advantages, mode: str, **kwargs) -> jax.Array:
    """L_i w_it A_i: the total push on response i (sum over its tokens).

    Under seq_mean_token_mean it is A_i / N for every length (each response
    counts once whatever its length, so a long wrong answer is penalised per
    token less); under token_mean it grows linearly with L_i.
    Arguments as `implied_token_weight`.
    """
    return _checks.to_float32(lengths) * implied_token_weight(lengths, advantages, mode, **kwargs)


def difficulty_weight(p, *, std_normalised: bool) -> jax.Array:
    """Per-prompt gradient weight E_g |A| for binary rewards with success rate p.

    With centred advantages A = r - p (A = 1 - p for a success, -p for a
    failure): E|A| = p (1 - p) + (1 - p) p = 2 p (1 - p).
    Dividing by the group std sqrt(p (1 - p)) (ddof = 0) gives
    2 sqrt(p (1 - p)): a relative up-weighting of 1 / sqrt(p (1 - p)) for
    prompts that are too easy (p -> 1) or too hard (p -> 0).

    Source: Liu et al. 2025, Dr. GRPO (arXiv 2503.20783), "question-level
    difficulty bias".

    Args:
      p: success rate(s) in [0, 1], any shape.
      std_normalised: True for GRPO (std), False for Dr. GRPO (no std).
    Returns:
      float32 of p's shape; 0 at p = 0 and p = 1 (no signal).
    """
    p = _checks.to_float32(p)
    variance = p * (1.0 - p)
    return 2.0 * jnp.sqrt(variance) if std_normalised else 2.0 * variance
