"""Tinker's built-in losses, each mapped onto the project's own `core.losses` function.

Tinker's conventions (its loss docs, tinker 0.38): every loss is a SUM over a datum's positions
(the caller's weights / advantages carry any normalisation), and the learner reports it as the
metric "loss:sum". Per position t of a datum, logp_t = log pi(target_tokens[t] | tokens[:t+1]):

  cross_entropy        l_t = -weights_t logp_t                     = core.pg_loss with A = weights
  importance_sampling  l_t = -exp(logp_t - q_t) A_t                 = core.ppo_clip_loss, clip range (0, 1e9)
  ppo                  l_t = -min(rho A, clip(rho, low, high) A)    = core.ppo_clip_loss
  cispo                l_t = -sg(clip(rho, low, high)) A logp_t     = core.cispo_loss

with q_t the sampler's log-prob (loss_fn_inputs "logprobs"), rho = exp(logp_t - q_t), and
`loss_fn_config` {"clip_low_threshold": low, "clip_high_threshold": high} (defaults 0.8, 1.2), the
ratio bounds themselves, so eps_low = 1 - low and eps_high = high - 1. The core functions clamp
|log rho| at 20 before exp (so importance_sampling's ratio can never overflow; below e^20 the two
formulas agree). Positions a loss should ignore carry weight / advantage 0.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

import jax.numpy as jnp

from jaxrl_llm.core import losses as core_losses

# The ratio bound no importance_sampling ratio can reach: |log rho| is clamped at 20 (e^20 ~ 4.9e8).
_NO_CLIP = 1e9


@dataclasses.dataclass(frozen=True)
class TinkerLoss:
    """A loss's needed per-position inputs (besides target_tokens), its config keys and its
    per-token function (logp [B, N], inputs by name [B, N], config, valid mask [B, N]) -> [B, N]."""

    inputs: tuple[str, ...]
    config_keys: tuple[str, ...]
    per_token: Callable


def _cross_entropy(logp, inputs, config, valid):
    return core_losses.pg_loss(logp, logp, inputs["weights"], valid).loss


def _importance_sampling(logp, inputs, config, valid):
    return core_losses.ppo_clip_loss(logp, inputs["logprobs"], inputs["advantages"], valid,
                                     eps_low=1.0, eps_high=_NO_CLIP).loss


def _clip_range(config: Mapping[str, float]) -> tuple[float, float]:
    low, high = float(config.get("clip_low_threshold", 0.8)), float(config.get("clip_high_threshold", 1.2))
    return 1.0 - low, high - 1.0


def _ppo(logp, inputs, config, valid):
    eps_low, eps_high = _clip_range(config)
    return core_losses.ppo_clip_loss(logp, inputs["logprobs"], inputs["advantages"], valid,
                                     eps_low=eps_low, eps_high=eps_high).loss


def _cispo(logp, inputs, config, valid):
    eps_low, eps_high = _clip_range(config)
    return core_losses.cispo_loss(logp, inputs["logprobs"], inputs["advantages"], valid,
                                  eps_low=eps_low, eps_high=eps_high).loss


_CLIP_KEYS = ("clip_low_threshold", "clip_high_threshold")
LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(("weights",), (), _cross_entropy),
    "importance_sampling": TinkerLoss(("logprobs", "advantages"), (), _importance_sampling),
    "ppo": TinkerLoss(("logprobs", "advantages"), _CLIP_KEYS, _ppo),
    "cispo": TinkerLoss(("logprobs", "advantages"), _CLIP_KEYS, _cispo),
}
# Tinker names this server refuses, each with why (the error names the call and these).
UNSUPPORTED_LOSSES = {
    "dro": "no core implementation yet",
    "gspo": "no Tinker-compatible mapping yet (core.gspo_loss normalises differently)",
    "stable_reinforce": "needs the sampler's stability records (record_stability_info)",
    "custom": "custom losses run client-side in tinker 0.38 and need forward_backward_custom",
}


def check_loss(name: str, config: Mapping[str, float | str]) -> TinkerLoss:
    """The loss called `name`, its config checked; ValueError naming what is valid otherwise."""
    if name not in LOSSES:
        why = f" ({UNSUPPORTED_LOSSES[name]})" if name in UNSUPPORTED_LOSSES else ""
        raise ValueError(f"loss_fn={name!r} is not supported by jaxrl serve-tinker{why}; "
                         f"valid: {sorted(LOSSES)}")
    loss = LOSSES[name]
    unknown = sorted(set(config) - set(loss.config_keys))
    if unknown:
        raise ValueError(f"loss_fn_config keys {unknown} are not read by loss_fn={name!r}; "
                         f"valid: {list(loss.config_keys) or 'none'}")
    if any(not isinstance(v, float) for v in config.values()):
        raise ValueError(f"loss_fn_config={dict(config)!r}: values must be numbers")
    if loss.config_keys:
        eps_low, eps_high = _clip_range(config)
        if not (0.0 <= eps_low <= 1.0 and eps_high >= 0.0):
            raise ValueError(f"loss_fn_config={dict(config)!r}: need 0 <= clip_low_threshold <= 1 <= "
                             "clip_high_threshold")
    return loss


def total_loss(loss: TinkerLoss, logp, inputs, config, valid) -> tuple[jnp.ndarray, jnp.ndarray]:
    """(sum of the per-token loss over every valid position, per-token loss [B, N])."""
    per_token = loss.per_token(logp, inputs, config, valid)
    return jnp.sum(per_token), per_token
