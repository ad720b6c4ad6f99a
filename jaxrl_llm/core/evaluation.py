"""Evaluation estimators (docs/objectives.md#evaluation)."""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.core import _checks


def pass_at_k(n, c, k: int) -> jax.Array:
    """Unbiased pass@k from n samples of which c are correct.

    pass@k = 1 - C(n - c, k) / C(n, k)
           = 1 - prod_{j=0}^{k-1} (n - c - j) / (n - j)

    Source: Chen et al. 2021, "Evaluating Large Language Models Trained on
    Code" (arXiv 2107.03374). The product form never builds a binomial
    coefficient (no overflow); each factor is in [0, 1]. If n - c < k some
    factor is 0, so pass@k = 1. k is static (a Python int) so the product has a
    fixed length and runs under jit.

    Args:
      n: samples per problem (int, any shape), n >= k.
      c: correct samples per problem, 0 <= c <= n, same shape as n.
      k: 1 <= k.
    Returns:
      float32 pass@k of the broadcast shape of n and c. With concrete inputs
      invalid (n, c, k) raise ValueError; under jit k > n gives NaN.
    """
    if not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k must be a positive Python int, got {k!r}")
    if _checks.all_concrete(n, c):
        n_host, c_host = np.asarray(n), np.asarray(c)
        if np.any(c_host < 0) or np.any(c_host > n_host):
            raise ValueError(f"need 0 <= c <= n, got n={n_host.tolist()}, c={c_host.tolist()}")
        if np.any(n_host < k):
            raise ValueError(f"need n >= k={k}, got n={n_host.tolist()}")
    n = jnp.asarray(n, jnp.float32)[..., None]
    c = jnp.asarray(c, jnp.float32)[..., None]
    j = jnp.arange(k, dtype=jnp.float32)
    remaining = n - j  # > 0 for every factor when n >= k
    safe_remaining = jnp.where(remaining > 0, remaining, 1.0)
    factors = jnp.where(remaining > 0, jnp.maximum(n - c - j, 0.0) / safe_remaining, jnp.nan)
    return 1.0 - jnp.prod(factors, axis=-1)


def avg_at_k(scores) -> jax.Array:
    """avg@k: mean score over k samples per problem.

    avg@k_p = (1/k) sum_j s_pj

    Less noisy than one greedy sample on small test sets (e.g. AIME's 30
    questions); report it with k. Average the result over problems for the
    benchmark number.

    Args:
      scores: [P, k] per-sample scores (0/1 correctness or graded).
    Returns:
      [P] float32.
    """
    chex.assert_rank(scores, 2)
    return jnp.mean(_checks.to_float32(scores), axis=1)
