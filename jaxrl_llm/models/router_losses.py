"""Router losses and metrics of a mixture of experts (``models.moe``), as pure functions of a
``Routing`` (router logits [B, T, nL, E] float32, experts [B, T, nL, k]) and a token mask [B, T]
(1 = a real token; padding and prompt tokens the caller leaves out get 0 and never count).

* ``load_balancing_loss``: Switch Transformer's auxiliary loss (Fedus et al. 2021, "Switch
  Transformers", arXiv 2101.03961, eqs. 4-6) in the top-k form transformers'
  ``load_balancing_loss_func`` computes for Qwen3-MoE / Mixtral:
  E * sum_e f_e * P_e, with f_e the fraction of (token, layer) rows that route to e (each row
  routes to k experts, so sum_e f_e = k) and P_e the mean router probability of e, both over the
  valid tokens of all layers together. It is k when f and P are uniform (E * sum_e (k/E)(1/E))
  and grows as the routing concentrates on few experts.
* ``router_z_loss``: ST-MoE's z-loss (Zoph et al. 2022, "ST-MoE: Designing Stable and Transferable
  Sparse Expert Models", arXiv 2202.08906, eq. 5): the mean over valid tokens (and layers) of
  logsumexp(router logits)^2; it keeps the router's logits small.
* ``router_metrics``: per layer, the expert load max / mean (1 = balanced, E/k = every token on
  the same k experts) and the mean entropy of the router's distribution (log E = uniform).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models.moe import Routing, top_k_experts


def _token_weights(shape: tuple[int, ...], mask: jax.Array | None) -> jax.Array:
    """mask [B, T] (None: all tokens) -> float32 [B, T, 1] to weight per-(token, layer) values."""
    weights = jnp.ones(shape[:2], jnp.float32) if mask is None else jnp.asarray(mask).astype(jnp.float32)
    if weights.shape != tuple(shape[:2]):
        raise ValueError(f"mask has shape {weights.shape}; valid: the routing's [batch, time] {tuple(shape[:2])}")
    return weights[:, :, None]


def _expert_counts(experts: jax.Array, num_experts: int, weights: jax.Array) -> jax.Array:
    """Weighted count of (token, slot) assignments per layer and expert: [nL, E]."""
    hits = jax.nn.one_hot(experts, num_experts, dtype=jnp.float32).sum(axis=-2)  # [B, T, nL, E]
    return jnp.sum(hits * weights[..., None], axis=(0, 1))


def load_balancing_loss(router_logits: jax.Array, top_k: int, mask: jax.Array | None = None,
                        experts: jax.Array | None = None) -> jax.Array:
    """Switch Transformer auxiliary loss (module docstring) of router_logits [B, T, nL, E] -> scalar.
    ``experts`` [B, T, nL, k]: the experts the forward used (e.g. replayed); None: the router's top-k."""
    num_experts = router_logits.shape[-1]
    probs = jax.nn.softmax(router_logits.astype(jnp.float32), axis=-1)
    experts = top_k_experts(probs, top_k) if experts is None else experts
    weights = _token_weights(router_logits.shape, mask)
    rows = jnp.sum(weights) * router_logits.shape[2]  # valid tokens x layers
    fraction_routed = jnp.sum(_expert_counts(experts, num_experts, weights), axis=0) / rows
    mean_prob = jnp.sum(probs * weights[..., None], axis=(0, 1, 2)) / rows
    return num_experts * jnp.sum(fraction_routed * mean_prob)


def router_z_loss(router_logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """ST-MoE z-loss: mean over valid tokens and layers of logsumexp(router_logits)^2 -> scalar."""
    weights = _token_weights(router_logits.shape, mask)
    squared = jax.nn.logsumexp(router_logits.astype(jnp.float32), axis=-1) ** 2  # [B, T, nL]
    return jnp.sum(squared * weights) / (jnp.sum(weights) * router_logits.shape[2])


class RouterMetrics(NamedTuple):
    """Per layer [nL]: expert load max / mean over experts, and mean router entropy (nats)."""
    load_max_over_mean: jax.Array
    entropy: jax.Array


def expert_load(experts: jax.Array, num_experts: int, mask: jax.Array | None = None) -> jax.Array:
    """Fraction of each layer's valid (token, slot) assignments that go to each expert: [nL, E], rows sum to 1."""
    counts = _expert_counts(experts, num_experts, _token_weights(experts.shape, mask))
    return counts / jnp.maximum(jnp.sum(counts, axis=-1, keepdims=True), 1.0)


def router_entropy(router_logits: jax.Array, mask: jax.Array | None = None) -> jax.Array:
    """Mean over valid tokens of the entropy -sum_e p_e log p_e of the router's softmax, per layer: [nL]."""
    weights = _token_weights(router_logits.shape, mask)
    log_probs = jax.nn.log_softmax(router_logits.astype(jnp.float32), axis=-1)
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)  # [B, T, nL]
    return jnp.sum(entropy * weights, axis=(0, 1)) / jnp.maximum(jnp.sum(weights), 1.0)


def router_metrics(routing: Routing, mask: jax.Array | None = None) -> RouterMetrics:
    """Per-layer load max/mean (E * the largest expert's share) and router entropy of a forward's Routing."""
    num_experts = routing.router_logits.shape[-1]
    load = expert_load(routing.experts, num_experts, mask)
    return RouterMetrics(num_experts * jnp.max(load, axis=-1), router_entropy(routing.router_logits, mask))
