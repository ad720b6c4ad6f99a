"""The model shapes the accelerator benchmarks run at (random weights): Qwen2.5 dense, Qwen3-30B-A3B's
mixture-of-experts layer, and their CPU-sized "tiny" forms, as `DecoderConfig`s (`model_config`)."""
from __future__ import annotations

from jaxrl_llm.models import DecoderConfig

# Architectures of the HF checkpoints Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B (config.json).
MODELS = {
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                         num_kv_heads=2, head_dim=64),
    "qwen2.5-1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                         num_kv_heads=2, head_dim=128),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                 head_dim=16),
}
# Mixture of experts (family qwen3_moe): Qwen/Qwen3-30B-A3B's layer (config.json: hidden 2048, 32 q /
# 4 kv heads of 128, 128 experts of width 768, top-8, normalised gates, untied head) with 4 of its 48
# layers: 3.1B parameters (0.85B active per token), ~18 bytes each in the learner (float32 master
# weights, AdamW's two moments, float32 gradients, the bf16 compute copy) = ~56 GB, which leaves one
# 141 GB H200 room for the activations of the experts (in the dense form all of them run on every
# token, `models.moe.experts_swiglu`; "auto" takes the ragged form on an accelerator). "tiny-moe": its CPU-sized form (4 experts, top-2).
MOE_MODELS = {
    "qwen3-30b-a3b-4l": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_layers=4, num_heads=32,
                             num_kv_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                             moe_intermediate_size=768, norm_topk_prob=True),
    "tiny-moe": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2,
                     head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True),
}


def model_config(name: str, seq_len: int) -> DecoderConfig:
    if name in MOE_MODELS:
        return DecoderConfig(**MOE_MODELS[name], family="qwen3_moe", tie_word_embeddings=False, rms_norm_eps=1e-6,
                             rope_theta=1_000_000.0, max_position_embeddings=max(seq_len, 32))
    if name not in MODELS:
        raise ValueError(f"model {name!r} is unknown; valid: {sorted(MODELS) + sorted(MOE_MODELS)}")
    return DecoderConfig(**MODELS[name], family="qwen2", qkv_bias=True, tie_word_embeddings=True,
                         rope_theta=1_000_000.0, max_position_embeddings=max(seq_len, 32))
