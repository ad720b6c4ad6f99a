"""Tiny random transformers models (the independent reference) for bridge tests."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from tests.models.hf_reference import random_hf_model  # noqa: E402

# Sizes divide a (fsdp=4, tensor=2) mesh: D=64, heads*hd=64, kv=32, F=96, V=96.
COMMON = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, max_position_embeddings=128, bos_token_id=1, eos_token_id=2)
# name -> (config class, model class, overrides): one per tensor set the bridge must map.
FAMILIES = {
    "llama_untied_attention_bias": ("LlamaConfig", "LlamaForCausalLM",
                                    dict(attention_bias=True, tie_word_embeddings=False)),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3_qk_norm": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=False)),
}


def tiny_model(name: str, seed: int = 0):
    """Random weights N(0, 0.2^2), norms U(0.5, 1.5): a mis-mapped tensor changes the logits."""
    config_cls, model_cls, overrides = FAMILIES[name]
    return random_hf_model(config_cls, model_cls, {**COMMON, **overrides}, seed)


def torch_logits(model, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def tokens(batch: int = 2, length: int = 12, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, COMMON["vocab_size"], (batch, length)).astype(np.int32)


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def state_numpy(model) -> dict[str, np.ndarray]:
    return {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
