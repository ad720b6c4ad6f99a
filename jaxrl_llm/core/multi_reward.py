"""Several rewards per response combined GDPO-style: each reward normalised within its group,
the normalised rewards summed with weights, the sum normalised over the batch
(docs/objectives.md#remax-and-gdpo).

Source: Liu et al. 2026, "GDPO: Group reward-Decoupled Normalization Policy Optimization for
Multi-reward RL Optimization" (arXiv 2601.05242). Normalising the weighted SUM instead (GRPO on
the total) maps different combinations of the rewards onto the same advantage; normalising each
reward first keeps them apart. `estimators.MultiRewardAdvantage` is the estimator a recipe names.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import advantages as adv_lib


def gdpo_advantages(reward_parts, weights, *, ddof: int = 1, eps: float = 1e-6) -> jax.Array:
    """A = whiten_batch( sum_k w_k (r_k - mean_g r_k) / (std_g r_k + eps) ).

    The group statistics are GRPO's (`advantages.grpo_advantages`: std with `ddof`, a group whose
    reward k is constant contributes exactly 0 for k); whiten_batch(x) = (x - mean x) /
    (std x + eps) over the P*G responses (population std), 0 when x is 0 everywhere.

    Args:
      reward_parts: [P, G, K] reward k of response (p, g).
      weights: K weights.
      ddof, eps: of the group std, as in grpo_advantages; eps is also the batch std's.
    Returns:
      [P, G] float32.
    """
    parts = jnp.asarray(reward_parts)
    if parts.ndim != 3:
        raise ValueError(f"reward_parts must be [P, G, K] (rank 3), got shape {parts.shape}")
    if len(weights) != parts.shape[2]:
        raise ValueError(f"{len(weights)} weights for {parts.shape[2]} rewards; valid: one weight per reward")
    summed = sum(float(w) * adv_lib.grpo_advantages(parts[:, :, k], ddof=ddof, eps=eps)
                 for k, w in enumerate(weights))
    centred = summed - jnp.mean(summed)
    centred = jnp.where(jnp.all(summed == 0.0), 0.0, centred)
    return adv_lib._safe_divide(centred, jnp.std(summed) + eps)
