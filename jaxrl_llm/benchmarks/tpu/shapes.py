"""Model shapes the compile takes by name: the architecture fields of the HF checkpoints'
config.json (Qwen/Qwen2.5-1.5B, -7B, -32B; Qwen/Qwen3-30B-A3B), no weights."""
from __future__ import annotations

from jaxrl_llm.models import DecoderConfig

_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
          "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 32768}
HF_CONFIGS = {
    "qwen2.5-1.5b": {**_QWEN2, "vocab_size": 151936, "hidden_size": 1536, "intermediate_size": 8960,
                     "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                     "tie_word_embeddings": True},
    "qwen2.5-7b": {**_QWEN2, "vocab_size": 152064, "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "tie_word_embeddings": False},
    "qwen2.5-32b": {**_QWEN2, "vocab_size": 152064, "hidden_size": 5120, "intermediate_size": 27648,
                    "num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
                    "tie_word_embeddings": False},
    "qwen3-30b-a3b": {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_act": "silu",
                      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 40960,
                      "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144,
                      "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                      "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                      "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
                      "tie_word_embeddings": False},
}


def model_shape(name: str, num_layers: int | None = None) -> DecoderConfig:
    """The `DecoderConfig` of a named shape (float32 params), optionally with fewer layers."""
    if name not in HF_CONFIGS:
        raise ValueError(f"--model {name!r} is not a known shape; valid: {', '.join(sorted(HF_CONFIGS))} "
                         "(or leave --model out to use model.source's config.json)")
    hf = dict(HF_CONFIGS[name])
    if num_layers is not None:
        hf["num_hidden_layers"] = num_layers
    return DecoderConfig.from_hf(hf)
