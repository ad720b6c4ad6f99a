"""Tiny random transformers models (the reference) and their params in our layout."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from jaxrl_llm.models import DecoderConfig, params_from_hf  # noqa: E402

_COMMON = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5)

# name -> (config class, model class, config overrides)
TINY_CONFIGS = {
    "llama_tied": ("LlamaConfig", "LlamaForCausalLM",
                   dict(tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 100000.0})),
    "llama3_rope_untied": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=False, num_key_value_heads=1,
        # original context 16 so the test's positions (up to ~40) cross all three frequency bands
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16})),
    "llama_attention_bias": ("LlamaConfig", "LlamaForCausalLM", dict(attention_bias=True, tie_word_embeddings=True)),
    "qwen2_qkv_bias": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3_qk_norm": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, tie_word_embeddings=False)),
}
# Qwen3-MoE: GQA, top-2 of a few experts, with and without renormalised top-k probabilities.
MOE_CONFIGS = {
    "qwen3_moe_norm_topk": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=16, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24,
        norm_topk_prob=True)),
    "qwen3_moe_raw_topk": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        head_dim=8, tie_word_embeddings=True, num_key_value_heads=1, num_experts=6, num_experts_per_tok=2,
        moe_intermediate_size=16, norm_topk_prob=False, num_hidden_layers=3)),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(
        num_local_experts=4, num_experts_per_tok=2, intermediate_size=24, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
}


def random_hf_model(config_cls: str, model_cls: str, config_kwargs: dict, seed: int = 0):
    """A transformers model with every weight drawn N(0, 0.2^2) and norms in [0.5, 1.5]
    (random norms and biases so a wrong mapping of any tensor shows up)."""
    config = getattr(transformers, config_cls)(**config_kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for param_name, param in model.named_parameters():
            if "norm" in param_name:
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.2)
    return model


def hf_model(name: str, seed: int = 0, **changes):
    """A random transformers model (see random_hf_model) of TINY_CONFIGS[name] (+ ``changes``)."""
    config_cls, model_cls, overrides = {**TINY_CONFIGS, **MOE_CONFIGS}[name]
    return random_hf_model(config_cls, model_cls, {**_COMMON, **overrides, **changes}, seed)


def our_config_and_params(model, **dtype_policy):
    cfg = DecoderConfig.from_hf(model.config.to_dict(), **dtype_policy)
    return cfg, params_from_hf(hf_checkpoint_tensors(model), cfg)


def hf_checkpoint_tensors(model) -> dict:
    """The model's tensors under checkpoint names: transformers 5 keeps a MoE layer's experts fused
    in memory (experts.gate_up_proj [E, 2F, D] = gate rows then up rows, experts.down_proj [E, D, F]);
    checkpoints (and vLLM) name them per expert, experts.{e}.{gate,up,down}_proj.weight (Mixtral:
    block_sparse_moe.gate.weight and block_sparse_moe.experts.{e}.{w1,w3,w2}.weight)."""
    mixtral = model.config.model_type == "mixtral"
    gate, up, down = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    out = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().numpy()
        if mixtral:
            name = name.replace(".mlp.", ".block_sparse_moe.")
        if name.endswith("experts.gate_up_proj"):
            prefix, width = name[:-len("gate_up_proj")], array.shape[1] // 2
            for e in range(array.shape[0]):
                out[f"{prefix}{e}.{gate}.weight"], out[f"{prefix}{e}.{up}.weight"] = array[e, :width], array[e, width:]
        elif name.endswith("experts.down_proj"):
            out.update({f"{name[:-len('down_proj')]}{e}.{down}.weight": array[e] for e in range(array.shape[0])})
        else:
            out[name] = array
    return out


def hf_logits(model, tokens: np.ndarray, attention_mask: np.ndarray | None = None, positions=None) -> np.ndarray:
    kwargs = {}
    if attention_mask is not None:
        kwargs["attention_mask"] = torch.tensor(attention_mask)
    if positions is not None:
        kwargs["position_ids"] = torch.tensor(positions)
    with torch.no_grad():
        return model(torch.tensor(tokens), **kwargs).logits.double().numpy()


def rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))


# SmolLM2-135M's config.json (HF hub), as the decoder, sharding and config tests read it.
SMOLLM2_CONFIG = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 576, "initializer_range": 0.041666666666666664,
    "intermediate_size": 1536, "is_llama_config": True, "max_position_embeddings": 8192, "model_type": "llama",
    "num_attention_heads": 9, "num_hidden_layers": 30, "num_key_value_heads": 3, "pad_token_id": 2,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_interleaved": False, "rope_scaling": None,
    "rope_theta": 100000, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.42.3",
    "use_cache": True, "vocab_size": 49152,
}
