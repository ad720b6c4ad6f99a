"""The learned critic of PPO: a value head on the policy's trunk.

V(s_t) = w . h_t + b, with h_t the policy's final (normed) hidden state at the position
that predicts completion token t, so V_0 is the value of the prompt alone. The head
reads the trunk through a stop-gradient: the critic is a probe of the policy's own
features, so it costs one forward-free [D] vector (the policy forward already computes
h), needs no second model in memory, cannot disturb the policy through the value loss,
and has its own optimiser and learning rate (`critic.lr`). That is the default and
only kind here; a separate critic model (Ouyang et al. 2022) would double the
forward/backward cost and weight memory, and is not implemented.

Training (Schulman et al. 2017, PPO; GAE from Schulman et al. 2016): values at rollout
time V_old feed `core.GaeAdvantage` for advantages and returns, and each optimiser
step descends value_coef * the clipped value loss (`core.clipped_value_loss`) with
the critic's optimiser (AdamW after global-norm clipping). During the first
`critic.warmup_steps` optimiser steps only the critic learns (the policy update is
held), so the first advantages do not come from an untrained critic.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


class CriticState(NamedTuple):
    params: Any  # {"w": float32 [D], "b": float32 []}
    opt_state: Any


def init_critic_params(hidden_size: int) -> dict:
    """Zero weights: V = 0 everywhere before training (no random value noise in the first
    advantages)."""
    return {"w": jnp.zeros((hidden_size,), jnp.float32), "b": jnp.zeros((), jnp.float32)}


def head_values(critic_params, hidden) -> jax.Array:
    """float32 [..., T] values from hidden states [..., T, D] (any float dtype; the trunk
    gets no gradient through them)."""
    hidden = jax.lax.stop_gradient(hidden).astype(jnp.float32)
    return hidden @ critic_params["w"] + critic_params["b"]


def make_critic_optimizer(critic_cfg) -> optax.GradientTransformation:
    """AdamW with the critic's own learning rate, after global-norm clipping."""
    parts = [] if critic_cfg.grad_clip is None else [optax.clip_by_global_norm(critic_cfg.grad_clip)]
    parts.append(optax.adamw(critic_cfg.lr, weight_decay=0.0))
    return optax.chain(*parts)


def critic_metrics(values, returns, mask) -> dict[str, jax.Array]:
    """Explained variance 1 - Var(R - V) / Var(R) over the valid tokens (1: V predicts the
    returns; 0: no better than their mean; < 0: worse), and the token means of V and R."""
    mask = jnp.asarray(mask, jnp.float32)
    count = jnp.maximum(jnp.sum(mask), 1.0)

    def var(x):
        mean = jnp.sum(x * mask) / count
        return jnp.sum(jnp.square(x - mean) * mask) / count

    return {"explained_variance": 1.0 - var(returns - values) / jnp.maximum(var(returns), 1e-8),
            "value_mean": jnp.sum(values * mask) / count, "return_mean": jnp.sum(returns * mask) / count}
