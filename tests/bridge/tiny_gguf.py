"""Write tiny GGUF files the way llama.cpp's convert_hf_to_gguf.py lays them out (for tests)."""
from __future__ import annotations

import gguf
import numpy as np

# GPT-2 byte-level alphabet for printable ASCII '!'..'~' is the characters themselves.
_BYTES = [chr(b) for b in range(33, 127)]
TOKENS = ["<s>", "</s>"] + _BYTES[:-1] + ["he"]  # 96 tokens; the merge "h e" makes "he"
MERGES = ["h e"]
_LAYER = {"input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
          "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
          "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_proj.bias": "attn_q.bias",
          "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
          "self_attn.o_proj.bias": "attn_output.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
          "self_attn.k_norm.weight": "attn_k_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
          "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
          "mlp.down_proj.weight": "ffn_down.weight"}
_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute: HF row s*hd/2 + j of each head -> row 2j + s."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def gguf_name(hf_name: str) -> str:
    if hf_name in _GLOBAL:
        return _GLOBAL[hf_name]
    _, _, index, rest = hf_name.split(".", 3)
    return f"blk.{index}.{_LAYER[rest]}"


def write_gguf(path, config: dict, state: dict[str, np.ndarray], *, arch: str, skip_fields=(),
               tokenizer_model: str = "gpt2") -> None:
    """``state``: HF-named float32 tensors; llama q/k rows are permuted as llama.cpp does."""
    writer = gguf.GGUFWriter(str(path), arch)
    fields = {
        "block_count": lambda: writer.add_block_count(config["num_hidden_layers"]),
        "context_length": lambda: writer.add_context_length(config["max_position_embeddings"]),
        "embedding_length": lambda: writer.add_embedding_length(config["hidden_size"]),
        "feed_forward_length": lambda: writer.add_feed_forward_length(config["intermediate_size"]),
        "head_count": lambda: writer.add_head_count(config["num_attention_heads"]),
        "head_count_kv": lambda: writer.add_head_count_kv(config["num_key_value_heads"]),
        "rms_eps": lambda: writer.add_layer_norm_rms_eps(config["rms_norm_eps"]),
        "rope_freq_base": lambda: writer.add_rope_freq_base(config.get("rope_theta", 10000.0)),
        "key_length": lambda: writer.add_key_length(config["head_dim"]),
    }
    for name, add in fields.items():
        if name not in skip_fields:
            add()
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(TOKENS)
    writer.add_token_types([3, 3] + [1] * (len(TOKENS) - 2))
    writer.add_token_merges(MERGES)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for hf_name, array in state.items():
        name = gguf_name(hf_name)
        kind = name.split(".")[2] if name.startswith("blk.") else ""
        if arch == "llama" and kind in heads:
            array = llama_cpp_permute(array, heads[kind])
        writer.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
