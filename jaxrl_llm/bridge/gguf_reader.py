"""GGUF (llama.cpp's format) -> HF config dict + HF-named float32 numpy tensors.

Spec: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md. Parsing and
dequantization (Q4_1, Q8_0, ...) are the ``gguf`` package's; this file maps
llama.cpp names and metadata keys back to Hugging Face ones and undoes the one
layout change llama.cpp's converter makes (``undo_rotary_permutation``).
"""
from __future__ import annotations

import os
from typing import Any

import gguf
import numpy as np

from jaxrl_llm.bridge.errors import CheckpointError

# GGUF general.architecture -> HF architecture / model_type.
GGUF_ARCHITECTURES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
}
# llama.cpp tensor name -> HF tensor name ("{i}" = layer index).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


class _BoundsCheckedReader(gguf.GGUFReader):
    """GGUFReader that names the tensor whose data runs past the end of a truncated file.

    Overrides the (private, stable across gguf 0.17-0.19) ``_build_tensors`` hook:
    each tensor-info field's parts are (name_len, name, n_dims, dims, type, offset).
    """

    def _build_tensors(self, start_offs: int, fields: list) -> None:
        file_size = len(self.data)
        for field in fields:
            _, name_data, _, dims, raw_type, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            try:
                block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_type[0]))]
            except (ValueError, KeyError) as err:
                raise CheckpointError(f"tensor {name!r} has unknown GGML type id {int(raw_type[0])}") from err
            end = start_offs + int(offset[0]) + int(np.prod(dims)) * type_size // block
            if end > file_size:
                raise CheckpointError(
                    f"tensor {name!r} ends at byte {end} but the file has {file_size} bytes; the file is truncated")
        super()._build_tensors(start_offs, fields)


def open_gguf(path: str | os.PathLike) -> gguf.GGUFReader:
    """Memory-map and parse a GGUF file; any parse failure is a CheckpointError naming the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CheckpointError(f"GGUF file {path!r} does not exist")
    try:
        return _BoundsCheckedReader(path)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, UnicodeDecodeError) as err:
        size = os.path.getsize(path)
        raise CheckpointError(
            f"{path}: not a readable GGUF file ({type(err).__name__}: {err}); "
            f"truncated or corrupted metadata? (file has {size} bytes)") from err


def field_value(reader: gguf.GGUFReader, key: str, default: Any = ...) -> Any:
    """A metadata value as a Python object; missing without a default -> CheckpointError naming the key."""
    field = reader.fields.get(key)
    if field is None:
        if default is ...:
            raise CheckpointError(f"{reader.data.filename}: GGUF metadata field {key!r} is missing")
        return default
    return field.contents()


def _as_float32_repr(value: float) -> float:
    """The shortest decimal that rounds to the same float32 (GGUF stores 1e-5 as 9.9999997e-06)."""
    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def hf_config_from_gguf(reader: gguf.GGUFReader) -> dict:
    """HF ``config.json`` dict for the model in a GGUF file (llama / qwen2 / qwen3 only)."""
    arch = field_value(reader, "general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise CheckpointError(
            f"{reader.data.filename}: GGUF general.architecture={arch!r} is not supported; valid: {sorted(GGUF_ARCHITECTURES)}")
    tensor_names = {t.name for t in reader.tensors}
    scaling = field_value(reader, f"{arch}.rope.scaling.type", "none")
    if scaling != "none" or "rope_freqs.weight" in tensor_names:
        raise CheckpointError(f"{reader.data.filename}: rotary scaling ({arch}.rope.scaling.type={scaling!r}, "
                              "or a rope_freqs.weight tensor) is not supported by the GGUF loader; valid: none")
    num_heads = int(field_value(reader, f"{arch}.attention.head_count"))
    hidden = int(field_value(reader, f"{arch}.embedding_length"))
    tokens = field_value(reader, "tokenizer.ggml.tokens", None)
    vocab_size = field_value(reader, f"{arch}.vocab_size", None)
    if vocab_size is None and tokens is None:
        raise CheckpointError(f"{reader.data.filename}: neither {arch}.vocab_size nor tokenizer.ggml.tokens is present")
    hf_arch, model_type = GGUF_ARCHITECTURES[arch]
    config = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "vocab_size": int(vocab_size if vocab_size is not None else len(tokens)),
        "hidden_size": hidden,
        "intermediate_size": int(field_value(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(field_value(reader, f"{arch}.block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(field_value(reader, f"{arch}.attention.head_count_kv", num_heads)),
        "head_dim": int(field_value(reader, f"{arch}.attention.key_length", hidden // num_heads)),
        "hidden_act": "silu",
        "rms_norm_eps": _as_float32_repr(field_value(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _as_float32_repr(field_value(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(field_value(reader, f"{arch}.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": arch == "llama" and "blk.0.attn_q.bias" in tensor_names,
    }
    for key in ("bos", "eos", "padding"):
        token_id = field_value(reader, f"tokenizer.ggml.{key}_token_id", None)
        if token_id is not None:
            config[f"{'pad' if key == 'padding' else key}_token_id"] = int(token_id)
    return config


def undo_rotary_permutation(weight: np.ndarray, num_heads: int) -> np.ndarray:
    """Invert llama.cpp's q/k row permutation (convert_hf_to_gguf.py ``LlamaModel.permute``).

    HF rotates dims (j, j + hd/2) of a head together ("rotate_half"); llama.cpp
    rotates adjacent pairs (2j, 2j + 1), so its converter moves HF row
    s * hd/2 + j of each head to row 2j + s. Rows of ``weight`` [H * hd, ...] are
    viewed as [H, hd/2, 2] and swapped back to [H, 2, hd/2]. Works for biases (1-D) too.
    """
    rows = weight.shape[0]
    if rows % (2 * num_heads):
        raise CheckpointError(f"cannot un-permute {rows} rows into {num_heads} heads of even size")
    per_half = rows // num_heads // 2
    return (weight.reshape(num_heads, per_half, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def hf_name_of(gguf_name: str) -> str:
    """llama.cpp tensor name -> HF name; unknown names raise, naming the tensor."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
    raise CheckpointError(f"GGUF tensor {gguf_name!r} has no HF counterpart; known: {sorted(_GLOBAL_NAMES)} "
                          f"and blk.N.{{{', '.join(sorted(_LAYER_NAMES))}}}")


def hf_tensors_from_gguf(reader: gguf.GGUFReader, config: dict) -> dict[str, np.ndarray]:
    """Dequantize every tensor to float32 under its HF name, q/k rows un-permuted for llama."""
    undo_permutation = config["model_type"] == "llama"
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    out = {}
    for tensor in reader.tensors:
        name = hf_name_of(tensor.name)
        try:
            array = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        except NotImplementedError as err:
            raise CheckpointError(f"{reader.data.filename}: tensor {tensor.name!r} has quantization "
                                  f"{tensor.tensor_type.name}, which gguf cannot dequantize: {err}") from err
        array = np.asarray(array, dtype=np.float32)
        kind = tensor.name.split(".")[2] if tensor.name.startswith("blk.") else ""
        if undo_permutation and kind in heads:
            array = undo_rotary_permutation(array, heads[kind])
        out[name] = array
    return out
