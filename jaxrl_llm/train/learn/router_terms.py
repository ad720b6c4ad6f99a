"""The router terms of a mixture-of-experts policy in the learner's gradient pass (`models.moe`,
`models.router_losses`): the loss added to the policy loss and the per-layer routing metrics.

Tokens: every real token the learner forwards (prompt and completion, ``segment_ids > 0`` of the
packed rows); padding slots never count, so packing and micro-batch sizes change nothing but the
load-balancing loss's grouping (below).

* z-loss (ST-MoE, Zoph et al. 2022, arXiv 2202.08906, eq. 5) is a mean over tokens and layers, so
  micro-batch m contributes (n_m / N) * z_m with n_m its real tokens and N the mini-batch's; the
  sum over micro-batches is the mini-batch's z-loss exactly, as the policy loss's micro-batch sums
  are (docs/objectives.md#masked-mean-micro-batch-bias).
* Load-balancing loss (Switch Transformer, Fedus et al. 2021, arXiv 2101.03961, eq. 4, in
  transformers' top-k form) is a product of two token means per expert, so it does not split into
  micro-batch sums: each micro-batch's own loss is taken (per micro-batch, as Megatron-LM computes
  it), weighted by n_m / N; with one micro-batch it is the mini-batch's loss. Qiu et al. 2025 ("Demons
  in the Detail", arXiv 2501.11873) balance over the global batch instead; that needs every
  micro-batch's routing before the backward pass (a second forward).
* Metrics (`router_step_metrics`): per layer, the expert load max / mean (load = fraction of the
  layer's routed (token, slot) assignments per expert; 1 = balanced, E / k = every token on the
  same k experts) and the mean router entropy (nats), over all of the mini-batch's real tokens,
  and the two losses (unscaled). Flat names: ``router/load_max_over_mean/layer{i}``,
  ``router/entropy/layer{i}``, ``router/load_balancing_loss``, ``router/z_loss``.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.models.moe import Routing
from jaxrl_llm.models.router_losses import expert_load, load_balancing_loss, router_entropy, router_z_loss

SUMS_KEY = "_router_sums"  # the micro-batch metrics entry `router_step_metrics` turns into the named metrics


class RouterCoefs(NamedTuple):
    """train.router_aux_loss_coef and train.router_z_loss_coef."""

    aux: float
    z: float


class RouterSums(NamedTuple):
    """One micro-batch's router terms, additive over micro-batches (the gradient pass's scan sums them)."""

    load_balancing: jax.Array  # (n_m / N) * the micro-batch's load-balancing loss
    z: jax.Array  # (n_m / N) * its z-loss
    expert_counts: jax.Array  # [nL, E] routed (token, slot) assignments
    entropy_sum: jax.Array  # [nL] sum over its real tokens of the router entropy


def router_coefs(model_cfg: DecoderConfig, train_cfg) -> RouterCoefs | None:
    """The coefficients of a MoE policy; None for a dense one, which must leave both at 0."""
    coefs = RouterCoefs(float(train_cfg.router_aux_loss_coef), float(train_cfg.router_z_loss_coef))
    if model_cfg.is_moe:
        return coefs
    for name, value in zip(("router_aux_loss_coef", "router_z_loss_coef"), coefs):
        if value != 0.0:
            raise ValueError(f"train.{name}={value!r} needs a mixture-of-experts policy; the policy is "
                             f"{model_cfg.architecture} (dense); valid: 0.0")
    return None


def real_token_count(segment_ids: jax.Array) -> jax.Array:
    """Real tokens (segment id > 0) of packed rows of any shape, float32."""
    return jnp.sum(segment_ids > 0).astype(jnp.float32)


def micro_router_sums(routing: Routing, segment_ids: jax.Array, total_tokens: jax.Array) -> RouterSums:
    """The router terms of one micro-batch of rows [R, W] (module doc); ``total_tokens``: N."""
    mask = segment_ids > 0
    tokens = jnp.sum(mask).astype(jnp.float32)
    share = jnp.where(tokens > 0, tokens / jnp.maximum(total_tokens, 1.0), 0.0)
    top_k, num_experts = routing.experts.shape[-1], routing.router_logits.shape[-1]
    balancing = load_balancing_loss(routing.router_logits, top_k, mask, experts=routing.experts)
    z = router_z_loss(routing.router_logits, mask)
    counts = expert_load(routing.experts, num_experts, mask) * tokens * top_k
    return RouterSums(jnp.where(tokens > 0, share * balancing, 0.0), jnp.where(tokens > 0, share * z, 0.0),
                      counts, router_entropy(routing.router_logits, mask) * tokens)


def add_router_loss(loss: jax.Array, metrics: dict, sums: RouterSums, coefs: RouterCoefs):
    """(loss + coef terms, metrics with that loss and the sums under SUMS_KEY) of one micro-batch."""
    loss = loss + coefs.aux * sums.load_balancing + coefs.z * sums.z
    return loss, {**metrics, "loss": loss, SUMS_KEY: sums}


def router_step_metrics(metrics: dict, total_tokens: jax.Array) -> dict:
    """The gradient pass's summed metrics with SUMS_KEY replaced by the named router metrics (module doc)."""
    metrics = dict(metrics)
    sums: RouterSums = metrics.pop(SUMS_KEY)
    num_experts = sums.expert_counts.shape[-1]
    load = sums.expert_counts / jnp.maximum(jnp.sum(sums.expert_counts, axis=-1, keepdims=True), 1.0)
    load_max_over_mean = num_experts * jnp.max(load, axis=-1)
    entropy = sums.entropy_sum / jnp.maximum(total_tokens, 1.0)
    metrics["router/load_balancing_loss"] = sums.load_balancing
    metrics["router/z_loss"] = sums.z
    for layer in range(load.shape[0]):
        metrics[f"router/load_max_over_mean/layer{layer}"] = load_max_over_mean[layer]
        metrics[f"router/entropy/layer{layer}"] = entropy[layer]
    return metrics
