"""A tiny random Qwen3-MoE as an HF directory vLLM serves, and transformers' router choices on
it (the independent reference for the routed experts the server records).

Sizes: vLLM's CPU attention has no kernel for head_dim 16 ("Unsupported CPU attention
configuration"), so heads are 64 wide like SmolLM2's. The vocabulary is SmolLM2's (49152): the
server needs a tokenizer, and SmolLM2's files are copied in. transformers 5.24's save_pretrained
writes the experts per expert (model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight), the
layout vLLM 0.32's Qwen3-MoE loader reads.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.models.hf_reference import random_hf_model, torch

TINY_QWEN3_MOE = dict(vocab_size=49152, hidden_size=128, intermediate_size=128, moe_intermediate_size=32,
                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                      mlp_only_layers=[], max_position_embeddings=512, tie_word_embeddings=False,
                      bos_token_id=1, eos_token_id=2, rms_norm_eps=1e-6)


def tiny_qwen3_moe(seed: int = 0):
    """transformers' Qwen3MoeForCausalLM, fp32, weights N(0, 0.2^2) and norms U(0.5, 1.5): router
    logits spread widely, so near-ties between the k-th and (k+1)-th expert are rare."""
    return random_hf_model("Qwen3MoeConfig", "Qwen3MoeForCausalLM", TINY_QWEN3_MOE, seed)


def save_tiny_qwen3_moe(model, directory: Path) -> str:
    """The model as an HF directory (float32 safetensors) with SmolLM2's tokenizer files."""
    from jaxrl_llm import bridge

    model.save_pretrained(str(directory))
    bridge.copy_tokenizer_files(bridge.smollm2_hf_dir(), directory)
    return str(directory)


def router_top_k(model, token_ids) -> np.ndarray:
    """int32 [T, num_layers, top_k]: the experts each layer's router picks for each token of one
    sequence (transformers' forward, fp32, top-k in descending probability order)."""
    picks = {}

    def keep(layer):
        return lambda module, args, output: picks.__setitem__(layer, output[2].numpy())

    hooks = [decoder_layer.mlp.gate.register_forward_hook(keep(i)) for i, decoder_layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            model(torch.tensor([list(map(int, token_ids))]))
    finally:
        for hook in hooks:
            hook.remove()
    return np.stack([picks[i] for i in range(len(model.model.layers))], axis=1).astype(np.int32)
