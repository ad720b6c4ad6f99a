"""HF tensor names <-> the params layout of ``decoder.py``: one explicit name map.

HF ``nn.Linear`` stores weight [out, in]; we store [in, out], so every matrix
but the embedding is transposed. Per-layer HF tensors are stacked on a leading
layer axis; a mixture of experts' per-expert tensors (``models.moe``; HF
``mlp.experts.E.{gate,up,down}_proj.weight``, the names Qwen3-MoE checkpoints and
vLLM's loader use) on a second, expert axis. Works on numpy-convertible arrays only
(no torch, no file I/O): ``jaxrl_llm.bridge`` reads/writes safetensors and GGUF
around these functions.
"""
from __future__ import annotations

import itertools
from typing import Any, Mapping, NamedTuple

import numpy as np

from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.moe import moe_param_shapes

# Top-level params key -> (HF name, transposed?).
TOP_LEVEL_NAMES = {
    "embed": ("model.embed_tokens.weight", False),
    "final_norm": ("model.norm.weight", False),
    "lm_head": ("lm_head.weight", True),
}
# params["layers"] key -> (HF name inside "model.layers.{i}.", transposed?).
LAYER_NAMES = {
    "input_norm": ("input_layernorm.weight", False),
    "q_proj": ("self_attn.q_proj.weight", True),
    "k_proj": ("self_attn.k_proj.weight", True),
    "v_proj": ("self_attn.v_proj.weight", True),
    "o_proj": ("self_attn.o_proj.weight", True),
    "q_bias": ("self_attn.q_proj.bias", False),
    "k_bias": ("self_attn.k_proj.bias", False),
    "v_bias": ("self_attn.v_proj.bias", False),
    "o_bias": ("self_attn.o_proj.bias", False),
    "q_norm": ("self_attn.q_norm.weight", False),
    "k_norm": ("self_attn.k_norm.weight", False),
    "post_norm": ("post_attention_layernorm.weight", False),
    "gate_proj": ("mlp.gate_proj.weight", True),
    "up_proj": ("mlp.up_proj.weight", True),
    "down_proj": ("mlp.down_proj.weight", True),
    "router": ("mlp.gate.weight", True),
}
# Mixtral's checkpoints name the MoE block "block_sparse_moe" and its experts' projections w1/w3/w2.
MIXTRAL_NAMES = {"router": "block_sparse_moe.gate.weight", "expert_gate": "w1.weight", "expert_up": "w3.weight",
                 "expert_down": "w2.weight"}
# params["layers"] key of a MoE layer -> (HF name inside "model.layers.{i}.mlp.experts.{e}.", transposed?).
EXPERT_NAMES = {
    "expert_gate": ("gate_proj.weight", True),
    "expert_up": ("up_proj.weight", True),
    "expert_down": ("down_proj.weight", True),
}
_DENSE_MLP = ("gate_proj", "up_proj", "down_proj")


class LeafNames(NamedTuple):
    """Where one params leaf lives in an HF checkpoint: its params ``shape``, the HF tensor ``names``
    (row-major over its first ``stacked`` axes: 0 top-level, 1 layers, 2 layers x experts) and
    whether each HF tensor is the ``transposed`` slice."""
    shape: tuple[int, ...]
    names: tuple[str, ...]
    stacked: int
    transposed: bool

# Buffers some checkpoints carry that are recomputed, not loaded.
_IGNORABLE_SUFFIXES = ("rotary_emb.inv_freq",)


def layer_keys(cfg: DecoderConfig) -> list[str]:
    """The params["layers"] keys this config has, in LAYER_NAMES order."""
    optional = {"q_bias": cfg.qkv_bias, "k_bias": cfg.qkv_bias, "v_bias": cfg.qkv_bias,
                "o_bias": cfg.o_bias, "q_norm": cfg.qk_norm, "k_norm": cfg.qk_norm, "router": cfg.is_moe,
                **{key: not cfg.is_moe for key in _DENSE_MLP}}
    keys = [key for key in LAYER_NAMES if optional.get(key, True)]
    return keys + (list(EXPERT_NAMES) if cfg.is_moe else [])


def top_level_keys(cfg: DecoderConfig) -> list[str]:
    return ["embed", "final_norm"] + ([] if cfg.tie_word_embeddings else ["lm_head"])


def leaf_names(cfg: DecoderConfig) -> dict[str, LeafNames]:
    """params path ('embed', 'layers/q_proj', 'layers/expert_up', ...) -> LeafNames, in layout order."""
    shapes = expected_shapes(cfg)
    out = {}
    for key in top_level_keys(cfg):
        name, transposed = TOP_LEVEL_NAMES[key]
        out[key] = LeafNames(shapes[key], (name,), 0, transposed)
    for key in layer_keys(cfg):
        shape = shapes["layers"][key]
        mixtral = cfg.family == "mixtral" and key in MIXTRAL_NAMES
        if key in EXPERT_NAMES:
            name, transposed = EXPERT_NAMES[key]
            name, block = (MIXTRAL_NAMES[key], "block_sparse_moe") if mixtral else (name, "mlp")
            names = tuple(f"model.layers.{i}.{block}.experts.{e}.{name}"
                          for i, e in itertools.product(range(cfg.num_layers), range(cfg.num_experts)))
            out[f"layers/{key}"] = LeafNames(shape, names, 2, transposed)
        else:
            name, transposed = LAYER_NAMES[key]
            name = MIXTRAL_NAMES[key] if mixtral else name
            out[f"layers/{key}"] = LeafNames(shape, tuple(f"model.layers.{i}.{name}" for i in range(cfg.num_layers)),
                                             1, transposed)
    return out


def hf_tensor_names(cfg: DecoderConfig) -> list[str]:
    """Every HF tensor name a checkpoint of this config holds (tied: no lm_head.weight)."""
    return [name for leaf in leaf_names(cfg).values() for name in leaf.names]


def params_from_hf(tensors: Mapping[str, Any], cfg: DecoderConfig, *, dtype: Any = None,
                   strict: bool = True) -> dict:
    """HF-named tensors -> params (numpy). Missing names raise KeyError listing them;
    with ``strict``, names that are not part of ``cfg`` raise too (a tied checkpoint's
    ``lm_head.weight`` and rotary buffers are accepted and ignored)."""
    expected = set(hf_tensor_names(cfg))
    missing = sorted(expected - set(tensors))
    if missing:
        raise KeyError(f"{len(missing)} tensor(s) missing for {cfg.architecture}: {missing[:8]}")
    if strict:
        tolerated = {"lm_head.weight"} if cfg.tie_word_embeddings else set()
        unexpected = sorted(name for name in set(tensors) - expected - tolerated
                            if not name.endswith(_IGNORABLE_SUFFIXES))
        if unexpected:
            raise KeyError(f"{len(unexpected)} unexpected tensor(s) for {cfg.architecture}: {unexpected[:8]}")

    def convert(name: str, transposed: bool) -> np.ndarray:
        array = np.asarray(tensors[name])
        array = array.T if transposed else array
        return array if dtype is None else array.astype(dtype)

    params: dict = {"layers": {}}
    for path, leaf in leaf_names(cfg).items():
        arrays = [convert(name, leaf.transposed) for name in leaf.names]
        array = arrays[0] if leaf.stacked == 0 else np.stack(arrays).reshape(leaf.shape)
        if path.startswith("layers/"):
            params["layers"][path[len("layers/"):]] = array
        else:
            params[path] = array
    _check_shapes(params, cfg)
    return params


def params_to_hf(params: Mapping[str, Any], cfg: DecoderConfig) -> dict[str, np.ndarray]:
    """params -> HF-named contiguous numpy tensors (layers unstacked, matrices transposed back)."""
    _check_shapes(params, cfg)
    out = {}
    for path, leaf in leaf_names(cfg).items():
        array = np.asarray(params["layers"][path[len("layers/"):]] if path.startswith("layers/") else params[path])
        for name, index in zip(leaf.names, np.ndindex(*leaf.shape[:leaf.stacked])):
            out[name] = np.ascontiguousarray(array[index].T if leaf.transposed else array[index])
    return out


def expected_shapes(cfg: DecoderConfig) -> dict:
    """The params layout of ``decoder.py`` as nested dict of shape tuples."""
    d, f, n, hd = cfg.hidden_size, cfg.intermediate_size, cfg.num_layers, cfg.head_dim
    layer = {"input_norm": (d,), "q_proj": (d, cfg.q_dim), "k_proj": (d, cfg.kv_dim), "v_proj": (d, cfg.kv_dim),
             "o_proj": (cfg.q_dim, d), "q_bias": (cfg.q_dim,), "k_bias": (cfg.kv_dim,), "v_bias": (cfg.kv_dim,),
             "o_bias": (d,), "q_norm": (hd,), "k_norm": (hd,), "post_norm": (d,),
             "gate_proj": (d, f), "up_proj": (d, f), "down_proj": (f, d)}
    if cfg.is_moe:
        layer.update(moe_param_shapes(d, cfg.num_experts, cfg.moe_intermediate_size))
    top = {"embed": (cfg.vocab_size, d), "final_norm": (d,), "lm_head": (d, cfg.vocab_size)}
    shapes = {key: top[key] for key in top_level_keys(cfg)}
    shapes["layers"] = {key: (n, *layer[key]) for key in layer_keys(cfg)}
    return shapes


def _check_shapes(params: Mapping[str, Any], cfg: DecoderConfig) -> None:
    expected = expected_shapes(cfg)
    got_layers = set(params.get("layers", {}))
    if set(params) != set(expected) or got_layers != set(expected["layers"]):
        raise ValueError(f"params keys {sorted(params)} / layers {sorted(got_layers)} do not match config "
                         f"{cfg.architecture}: expected {sorted(expected)} / {sorted(expected['layers'])}")
    for key, shape in [(k, s) for k, s in expected.items() if k != "layers"] + \
                      [(f"layers/{k}", s) for k, s in expected["layers"].items()]:
        array = params["layers"][key[7:]] if key.startswith("layers/") else params[key]
        if tuple(np.shape(array)) != shape:
            raise ValueError(f"params[{key!r}] has shape {tuple(np.shape(array))}, expected {shape}")
