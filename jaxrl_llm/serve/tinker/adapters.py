"""LoRA adapters as Tinker's LoraConfig describes them, on one shared base model.

Tinker's flags map onto the project's LoRA (`models.lora`): train_attn -> q/k/v/o projections,
train_mlp -> gate/up/down projections, train_unembed -> a rank-r adapter on the LM head
(logits = h (W_out + s A B), A [D, r] ~ N(0, 1/D), B [r, V] = 0, so it starts as the base model
like the others). A tied model (SmolLM2) is served untied: W_out starts as embed^T, which gives
the same logits, and its adapter then moves the output layer only, as an unembedding LoRA does.
The update scale is s = alpha / r with alpha = 32 (Tinker does not expose alpha; fixed here).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.models import lora
from jaxrl_llm.models.lora import LORA_TARGETS, MLP_TARGETS

LORA_ALPHA = 32.0
ATTENTION_TARGETS = tuple(t for t in LORA_TARGETS if t not in MLP_TARGETS)


@dataclasses.dataclass(frozen=True)
class AdapterConfig:
    """What a create_model's lora_config asks for, checked against the base model."""

    rank: int
    seed: int
    targets: tuple[str, ...]  # the decoder projections adapted
    unembed: bool

    @property
    def scale(self) -> float:
        return LORA_ALPHA / self.rank


def adapter_config(lora_config: dict | None, cfg: DecoderConfig, default_seed: int) -> AdapterConfig:
    """Tinker's LoraConfig (rank, seed, train_mlp, train_attn, train_unembed) -> AdapterConfig;
    ValueError naming the bad field and what is valid."""
    if lora_config is None:
        raise ValueError("create_model without lora_config (full fine-tuning) is not supported by "
                         "jaxrl serve-tinker; valid: a lora_config with rank >= 1")
    rank = lora_config.get("rank")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 1:
        raise ValueError(f"lora_config.rank={rank!r}; valid: an integer >= 1")
    seed = lora_config.get("seed")
    seed = default_seed if seed is None else int(seed)
    targets = ((ATTENTION_TARGETS if lora_config.get("train_attn", True) else ())
               + (MLP_TARGETS if lora_config.get("train_mlp", True) else ()))
    unembed = bool(lora_config.get("train_unembed", True))
    if not targets and not unembed:
        raise ValueError("lora_config trains nothing (train_attn, train_mlp and train_unembed all false); "
                         "valid: at least one of them true")
    if getattr(cfg, "is_moe", False) and any(t in MLP_TARGETS for t in targets):
        raise ValueError("lora_config.train_mlp=true on a mixture-of-experts base model (LoRA does not adapt "
                         "experts here); valid: train_mlp=false")
    return AdapterConfig(rank=rank, seed=seed, targets=tuple(targets), unembed=unembed)


def untied(cfg: DecoderConfig, params: dict) -> tuple[DecoderConfig, dict]:
    """The same model with its own output layer (lm_head [D, V] = embed^T when tied)."""
    if not cfg.tie_word_embeddings:
        return cfg, params
    return (dataclasses.replace(cfg, tie_word_embeddings=False),
            {**params, "lm_head": jnp.asarray(params["embed"]).T})


def init_adapters(base: dict, config: AdapterConfig) -> dict:
    """{"layers": {...}} (project LoRA, possibly empty) and, with unembed, {"lm_head": {"a", "b"}}."""
    key_layers, key_head = jax.random.split(jax.random.PRNGKey(config.seed))
    adapters: dict[str, Any] = {"layers": {}}
    if config.targets:
        spec = lora.LoraSpec(rank=config.rank, alpha=LORA_ALPHA, targets=config.targets)
        adapters = lora.init_adapters(base, spec, key_layers)
    if config.unembed:
        d, v = np.shape(base["lm_head"])
        a = jax.random.normal(key_head, (d, config.rank), jnp.float32) * (d ** -0.5)
        adapters["lm_head"] = {"a": a, "b": jnp.zeros((config.rank, v), jnp.float32)}
    return adapters


def merge(base: dict, adapters: dict, scale: float) -> dict:
    """Full params of base + adapters (pure, jittable): `models.lora.merge` for the decoder's
    projections, W_out + s A B for the LM head (the sampler's params)."""
    params = lora.merge(base, adapters, scale) if adapters["layers"] else dict(base)
    return with_head(params, adapters, scale)


def with_head(params: dict, adapters: dict, scale: float) -> dict:
    """params with the client's LM head W_out + s A B (params unchanged without an LM-head adapter)."""
    if "lm_head" not in adapters:
        return params
    pair = adapters["lm_head"]
    return {**params, "lm_head": params["lm_head"] + scale * jnp.dot(pair["a"], pair["b"],
                                                                   precision=jax.lax.Precision.HIGHEST)}


def group_factors(adapters: dict, scale: float) -> dict:
    """The client's decoder adapters as one group of a `models.lora.GroupedLora` (scale folded into B)."""
    return {name: {"a": pair["a"], "b": scale * pair["b"]} for name, pair in adapters["layers"].items()}
