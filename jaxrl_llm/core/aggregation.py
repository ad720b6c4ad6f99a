"""Loss aggregation with explicit per-token weights (docs/objectives.md#aggregation-modes).

Every mode is  L = sum_i sum_t w_it l_it  with weights from `token_weights`:

  mode                  w_it                       bias
  seq_mean_token_mean   m_it / (N L_i)             1/L_i: short answers up-weighted,
                                                   long wrong answers under-penalised
                                                   (GRPO, Shao et al. 2024)
  token_mean            m_it / sum_js m_js         sequence weight grows with L_i
                                                   (DAPO, Yu et al. 2025; Olmo 3)
  seq_mean_token_sum    m_it / N                   unbiased
  constant              m_it / (N L_const)         unbiased (Dr. GRPO, Liu et al. 2025)

L_i = sum_t m_it, and N = the number of responses with at least one valid
token. Counting only non-empty rows makes masking a response out (zero-
variance filter, truncation, sequence-level rejection) exactly equivalent to
removing it from the batch, and lets empty responses (L_i = 0) exist without
a division by zero: their weights are 0.

The weights are computed ONCE on the whole optimiser-step batch, before it is
split into micro-batches or sharded. A micro-batch's loss is then the plain
sum of its pre-weighted terms, so gradient accumulation and data-parallel
reduction are sums and equal the single-pass gradient (the bugs this avoids:
verl #5625, #3741; TRL #2881 -> #3256; slime #657).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks

AGGREGATION_MODES = ("seq_mean_token_mean", "token_mean", "seq_mean_token_sum", "constant")


def check_mode(mode: str) -> None:
    """Raises ValueError naming `mode` and the valid modes unless it is one of them."""
    if mode not in AGGREGATION_MODES:
        raise ValueError(
            f"unknown aggregation mode {mode!r}; valid modes: {', '.join(AGGREGATION_MODES)}"
        )


def _check_constant_length(constant_length) -> None:
    if constant_length is None:
        raise ValueError(
            "aggregation mode 'constant' needs an explicit constant_length (a fixed "
            "number such as the maximum generation length); the padded width of a "
            "batch is never used because it changes with padding and micro-batching"
        )
    _checks.check_positive("constant_length", constant_length)


def response_lengths(mask) -> jax.Array:
    """[N] float32 number of valid tokens L_i of each response."""
    return jnp.sum(_checks.valid_tokens(mask), axis=1).astype(jnp.float32)


def num_responses(mask) -> jax.Array:
    """Scalar float32 N: responses with at least one valid token."""
    return jnp.sum(response_lengths(mask) > 0).astype(jnp.float32)


def token_weights(mask, mode: str, *, constant_length: float | None = None) -> jax.Array:
    """Per-token weights w_it of the aggregation `mode` (formulas in the module doc).

    Call once on the full optimiser-step batch: the denominators (N, sum of m,
    N L_const) are global. Tokens already removed from `mask` (by filters or
    corrections) leave every denominator.

    Args:
      mask: [N, T], non-zero on valid tokens.
      mode: one of AGGREGATION_MODES.
      constant_length: L_const > 0, required for (and only used by) 'constant'.
    Returns:
      [N, T] float32 weights, exactly 0 on invalid tokens.
    """
    check_mode(mode)
    if mode == "constant":
        _check_constant_length(constant_length)
    valid = _checks.valid_tokens(mask)
    ones = valid.astype(jnp.float32)
    lengths = jnp.sum(ones, axis=1, keepdims=True)
    count = jnp.maximum(jnp.sum(lengths > 0), 1).astype(jnp.float32)
    if mode == "seq_mean_token_mean":
        return ones / (count * jnp.maximum(lengths, 1.0))
    if mode == "token_mean":
        return ones / jnp.maximum(jnp.sum(ones), 1.0)
    if mode == "seq_mean_token_sum":
        return ones / count
    return ones / (count * jnp.float32(constant_length))


def aggregate(per_token_loss, weights) -> jax.Array:
    """Weighted sum of per-token losses: L = sum_it w_it l_it.

    Positions with w_it = 0 contribute exactly 0 to the value and exactly 0
    to the gradient even if l_it is NaN or inf there: the loss is replaced by
    0 with jnp.where BEFORE the product (0 * inf would be NaN).

    Args:
      per_token_loss: [N, T] (any float dtype; summed in float32).
      weights: [N, T] from `token_weights` (or any slice of them).
    Returns:
      float32 scalar.
    """
    _checks.check_float(per_token_loss, 2)
    _checks.check_float(weights, 2)
    _checks.check_same_shape(per_token_loss=per_token_loss, weights=weights)
    loss = _checks.to_float32(per_token_loss)
    weights = _checks.to_float32(weights)
    kept = weights != 0
    return jnp.sum(weights * jnp.where(kept, loss, 0.0))

