"""Decoder configuration for the Llama / Qwen2 / Qwen3 family, read from and
written to Hugging Face ``config.json`` dicts.

One frozen (hashable) dataclass describes the architecture and the dtype
policy, so it can be a static argument of ``jax.jit``. The three families
differ only in a few switches:

| family | HF architecture    | switches                                          |
|--------|--------------------|---------------------------------------------------|
| llama  | LlamaForCausalLM   | ``attention_bias`` -> q/k/v AND o biases           |
| qwen2  | Qwen2ForCausalLM   | q/k/v biases always, no o bias                    |
| qwen3  | Qwen3ForCausalLM   | per-head RMSNorm on q and k, explicit ``head_dim`` |
| qwen3_moe | Qwen3MoeForCausalLM | qwen3 attention; every MLP a mixture of experts |
| mixtral | MixtralForCausalLM | llama attention (no biases); every MLP a mixture of experts (gates renormalised) |

Qwen3-MoE (``num_experts`` > 0): each layer's MLP is a top-k softmax router over
``num_experts`` SwiGLU experts of width ``moe_intermediate_size`` (``models.moe``). Only
all-sparse models load (``decoder_sparse_step`` 1, ``mlp_only_layers`` empty, as
Qwen3-30B-A3B); others raise naming the value.

All use RMSNorm (Zhang & Sennrich 2019), SwiGLU MLP (Shazeer 2020), grouped
query attention (Ainslie et al. 2023) and rotary embeddings (Su et al. 2021),
optionally with Llama 3.1's frequency-dependent "llama3" rescaling.

Both config styles on disk are accepted: transformers 4 (``rope_theta`` +
``rope_scaling``) and transformers 5 (``rope_parameters``). ``to_hf`` writes
the style it read and carries every key it does not model (token ids,
``torch_dtype``, ...) through unchanged.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Mapping

import jax.numpy as jnp

from jaxrl_llm.models.moe import MOE_EXPERT_FORMS, MOE_FAMILIES, check_moe_fields, parse_moe_fields

# HF architecture name -> (family, HF model_type).
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "llama"),
    "Qwen2ForCausalLM": ("qwen2", "qwen2"),
    "Qwen3ForCausalLM": ("qwen3", "qwen3"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "qwen3_moe"),
    "MixtralForCausalLM": ("mixtral", "mixtral"),
}
_FAMILY_TO_ARCH = {family: arch for arch, (family, _) in SUPPORTED_ARCHITECTURES.items()}

# Accepted spellings of the three dtypes of the precision policy.
_DTYPE_ALIASES = {
    "float32": "float32", "fp32": "float32", "f32": "float32",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
    "float16": "float16", "fp16": "float16", "f16": "float16", "half": "float16",
}
_VALID_DTYPES = "float32/fp32, bfloat16/bf16, float16/fp16"
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")

# Defaults of the transformers config classes, used when a key is absent.
_HF_DEFAULTS = {
    "llama": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=2048),
    "qwen2": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768),
    "qwen3": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768),
    "qwen3_moe": dict(rms_norm_eps=1e-6, rope_theta=10000.0, max_position_embeddings=32768),
    "mixtral": dict(rms_norm_eps=1e-5, rope_theta=1e6, max_position_embeddings=131072),
}
# Qwen3MoeConfig's defaults of the MoE keys (transformers 5), used when a key is absent.
_MOE_DEFAULTS = dict(num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768, norm_topk_prob=False,
                     decoder_sparse_step=1, mlp_only_layers=[])
_REQUIRED_KEYS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
# Keys that DecoderConfig models; all other keys go to hf_extra untouched.
_MODELED_KEYS = set(_REQUIRED_KEYS) | {
    "architectures", "model_type", "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
    "rope_scaling", "rope_parameters", "tie_word_embeddings", "attention_bias", "max_position_embeddings",
    "hidden_act", "mlp_bias", "use_sliding_window",
} | set(_MOE_DEFAULTS) | {"num_local_experts"}


def canonical_dtype_name(name: Any, what: str = "dtype") -> str:
    """Map 'bf16', 'bfloat16', jnp.bfloat16, ... to 'float32' | 'bfloat16' | 'float16'."""
    if not isinstance(name, str):
        try:
            name = jnp.dtype(name).name
        except TypeError as err:
            raise ValueError(f"{what}={name!r} is not a dtype; valid: {_VALID_DTYPES}") from err
    key = name.lower()
    if key not in _DTYPE_ALIASES:
        raise ValueError(f"{what}={name!r} is not supported; valid: {_VALID_DTYPES}")
    return _DTYPE_ALIASES[key]


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """Rotary-frequency rescaling. 'linear': inv_freq / factor. 'llama3': Llama 3.1 scheme
    (low frequencies divided by ``factor``, high ones kept, smooth interpolation between)."""

    rope_type: str
    factor: float
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    original_max_position_embeddings: int | None = None

    def __post_init__(self):
        if self.rope_type not in ("linear", "llama3"):
            raise ValueError(f"rope_type={self.rope_type!r} is not supported; valid: {SUPPORTED_ROPE_TYPES}")
        if self.rope_type == "llama3":
            for name in ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
                if getattr(self, name) is None:
                    raise ValueError(f"rope_type='llama3' needs rope scaling field {name!r}")

    def to_hf(self) -> dict:
        out = {"rope_type": self.rope_type, "factor": self.factor}
        if self.rope_type == "llama3":
            out.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                       original_max_position_embeddings=self.original_max_position_embeddings)
        return out


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """Architecture + dtype policy of a Llama/Qwen2/Qwen3 decoder.

    ``param_dtype`` is the storage dtype of parameters; ``compute_dtype`` the dtype of
    activations and matmul inputs. Whatever both are, RMSNorm statistics, rotary
    embeddings, attention softmax and the final log-softmax run in float32.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    family: str = "llama"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    o_bias: bool = False
    max_position_embeddings: int = 2048
    # Mixture of experts (family qwen3_moe; 0 = dense): experts per layer, experts per token (k),
    # each expert's SwiGLU width, and whether the k gate weights are renormalised to sum to 1.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    # How the experts are computed (models.moe.MOE_EXPERT_FORMS): "ragged" (grouped matmuls over each
    # expert's tokens: the active FLOPs forward), "dense" (every expert on every token: E/k times those),
    # or "auto": dense when compiled for a CPU (no ragged matmul in XLA:CPU); for TPU/GPU the ragged
    # forward with the dense form's gradient. Not in config.json.
    moe_experts: str = "auto"
    param_dtype: str = "float32"
    compute_dtype: str = "float32"
    # Original HF names and the unmodeled keys; not part of equality/hash (no effect on compute).
    architecture: str = dataclasses.field(default="", compare=False)
    model_type: str = dataclasses.field(default="", compare=False)
    hf_extra_json: str = dataclasses.field(default="{}", compare=False, repr=False)
    hf_rope_style: str = dataclasses.field(default="rope_scaling", compare=False, repr=False)

    def __post_init__(self):
        if self.family not in _FAMILY_TO_ARCH:
            raise ValueError(f"family={self.family!r} is not supported; valid: {sorted(_FAMILY_TO_ARCH)}")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name}={value!r} must be a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        if not self.rms_norm_eps > 0 or not self.rope_theta > 0:
            raise ValueError(f"rms_norm_eps={self.rms_norm_eps} and rope_theta={self.rope_theta} must be > 0")
        _check_family_switches(self.family, self.qkv_bias, self.o_bias)
        check_moe_fields(self.family, self.num_experts, self.num_experts_per_tok, self.moe_intermediate_size,
                         self.norm_topk_prob)
        if self.moe_experts not in MOE_EXPERT_FORMS:
            raise ValueError(f"moe_experts={self.moe_experts!r} is not supported; valid: {MOE_EXPERT_FORMS}")
        object.__setattr__(self, "param_dtype", canonical_dtype_name(self.param_dtype, "param_dtype"))
        object.__setattr__(self, "compute_dtype", canonical_dtype_name(self.compute_dtype, "compute_dtype"))
        if not self.architecture:
            object.__setattr__(self, "architecture", _FAMILY_TO_ARCH[self.family])
        if not self.model_type:
            object.__setattr__(self, "model_type", SUPPORTED_ARCHITECTURES[_FAMILY_TO_ARCH[self.family]][1])

    # ---- derived ----
    @property
    def qk_norm(self) -> bool:
        """Qwen3's per-head RMSNorm on queries and keys before the rotary embedding."""
        return self.family in ("qwen3", "qwen3_moe")

    @property
    def is_moe(self) -> bool:
        """Every layer's MLP is a mixture of experts (``models.moe``)."""
        return self.num_experts > 0

    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def hf_extra(self) -> dict:
        return json.loads(self.hf_extra_json)

    def with_dtypes(self, param_dtype: Any = None, compute_dtype: Any = None) -> "DecoderConfig":
        """Same architecture, another precision policy (None keeps the current one)."""
        return dataclasses.replace(
            self,
            param_dtype=self.param_dtype if param_dtype is None else param_dtype,
            compute_dtype=self.compute_dtype if compute_dtype is None else compute_dtype,
        )

    def num_params(self) -> int:
        """Parameter count of the layout in ``decoder.py`` (embedding counted once when tied)."""
        return self._count_params(self.num_experts)

    def num_active_params(self) -> int:
        """Parameters one token uses: as ``num_params`` with only its k experts (the router counted whole)."""
        return self._count_params(self.num_experts_per_tok)

    def _count_params(self, experts: int) -> int:
        d, f, n = self.hidden_size, self.intermediate_size, self.num_layers
        mlp = d * self.num_experts + 3 * experts * d * self.moe_intermediate_size if self.is_moe else 3 * d * f
        per_layer = 2 * d + d * self.q_dim + 2 * d * self.kv_dim + self.q_dim * d + mlp
        per_layer += (self.q_dim + 2 * self.kv_dim) * self.qkv_bias + d * self.o_bias + 2 * self.head_dim * self.qk_norm
        head = 0 if self.tie_word_embeddings else d * self.vocab_size
        return self.vocab_size * d + n * per_layer + d + head

    # ---- HF interop ----
    @classmethod
    def from_hf(cls, config: Mapping[str, Any] | str | os.PathLike, *, param_dtype: Any = "float32",
                compute_dtype: Any = "float32") -> "DecoderConfig":
        """Build from a HF config dict, a path to ``config.json``, or a directory holding one."""
        hf = _load_hf_dict(config)
        family, architecture = _family_of(hf)
        missing = [key for key in _REQUIRED_KEYS if hf.get(key) is None]
        if family in ("qwen3", "qwen3_moe") and hf.get("head_dim") is None:
            missing.append("head_dim")
        if missing:
            raise ValueError(f"HF config ({architecture}) is missing required field(s) {missing}")
        _reject_unsupported(hf, architecture)
        defaults = _HF_DEFAULTS[family]
        num_heads = int(hf["num_attention_heads"])
        rope_theta, rope_scaling, rope_style = _parse_rope(hf, defaults["rope_theta"])
        attention_bias = bool(hf.get("attention_bias", False))
        extra = {k: v for k, v in hf.items() if k not in _MODELED_KEYS}
        moe = parse_moe_fields(hf, architecture, _MOE_DEFAULTS) if family in MOE_FAMILIES else {}
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(hf.get("head_dim") or int(hf["hidden_size"]) // num_heads),
            family=family,
            rms_norm_eps=float(hf.get("rms_norm_eps", defaults["rms_norm_eps"])),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family != "qwen2" and attention_bias,
            max_position_embeddings=int(hf.get("max_position_embeddings", defaults["max_position_embeddings"])),
            **moe,
            param_dtype=param_dtype,
            compute_dtype=compute_dtype,
            architecture=architecture,
            model_type=hf.get("model_type") or SUPPORTED_ARCHITECTURES[architecture][1],
            hf_extra_json=json.dumps(extra, sort_keys=True, default=str),
            hf_rope_style=rope_style,
        )

    def to_hf(self) -> dict:
        """HF ``config.json`` dict (loadable by transformers 4/5 and vLLM)."""
        out = dict(self.hf_extra)
        out.update(
            architectures=[self.architecture],
            model_type=self.model_type,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            hidden_act="silu",
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_word_embeddings,
            max_position_embeddings=self.max_position_embeddings,
        )
        if self.family == "mixtral":
            out.update(num_local_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok)
        elif self.is_moe:
            out.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                       moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                       decoder_sparse_step=1, mlp_only_layers=[])
        if self.qk_norm or self.head_dim != self.hidden_size // self.num_heads:
            out["head_dim"] = self.head_dim  # otherwise loaders derive the same value
        if self.family != "qwen2":
            out["attention_bias"] = self.o_bias
        scaling = self.rope_scaling.to_hf() if self.rope_scaling else None
        if self.hf_rope_style == "rope_parameters":
            out["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default", **(scaling or {})}
        else:
            out["rope_theta"] = self.rope_theta
            out["rope_scaling"] = scaling
        return out


def tiny_decoder_config(**overrides: Any) -> DecoderConfig:
    """The tiny decoder of the tests and experiments (2 layers, width 32, SmolLM2's
    49152-token vocabulary, tied embeddings as SmolLM2): seconds to train on a CPU, not a
    model of any size that matters. `overrides` replace fields (e.g. vocab_size=16)."""
    fields = dict(vocab_size=49152, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, tie_word_embeddings=True, rms_norm_eps=1e-5,
                  max_position_embeddings=512)
    return DecoderConfig(**{**fields, **overrides})


def _check_family_switches(family: str, qkv_bias: bool, o_bias: bool) -> None:
    """The bias switches HF can express: Qwen2 always has q/k/v biases and no o bias;
    Llama/Qwen3 have all four biases or none (one ``attention_bias`` flag)."""
    if family == "qwen2" and (not qkv_bias or o_bias):
        raise ValueError(f"family='qwen2' needs qkv_bias=True, o_bias=False; got qkv_bias={qkv_bias}, o_bias={o_bias}")
    if family != "qwen2" and qkv_bias != o_bias:
        raise ValueError(f"family={family!r} has one attention_bias flag: qkv_bias={qkv_bias} and o_bias={o_bias} "
                         "must be equal")


def _load_hf_dict(config) -> dict:
    if isinstance(config, Mapping):
        return dict(config)
    path = os.fspath(config)
    if os.path.isdir(path):
        path = os.path.join(path, "config.json")
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _family_of(hf: Mapping[str, Any]) -> tuple[str, str]:
    """Family from ``architectures[0]``, or from ``model_type`` when architectures is absent."""
    architectures = hf.get("architectures") or []
    if architectures:
        architecture = architectures[0]
    else:
        by_type = {model_type: arch for arch, (_, model_type) in SUPPORTED_ARCHITECTURES.items()}
        architecture = by_type.get(hf.get("model_type"), f"model_type={hf.get('model_type')!r}")
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {architecture!r}; supported: {sorted(SUPPORTED_ARCHITECTURES)}")
    return SUPPORTED_ARCHITECTURES[architecture][0], architecture


def _reject_unsupported(hf: Mapping[str, Any], architecture: str) -> None:
    """Features the decoder does not implement raise instead of silently computing something else."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"{architecture}: hidden_act={hf['hidden_act']!r} is not supported; valid: 'silu'")
    if hf.get("mlp_bias"):
        raise ValueError(f"{architecture}: mlp_bias=True is not supported; valid: False")
    if hf.get("use_sliding_window") or "sliding_attention" in (hf.get("layer_types") or []):
        raise ValueError(f"{architecture}: sliding-window attention is not supported; valid: use_sliding_window=False")


def _parse_rope(hf: Mapping[str, Any], default_theta: float) -> tuple[float, RopeScaling | None, str]:
    """(rope_theta, scaling, style) from either transformers-4 or transformers-5 keys."""
    if isinstance(hf.get("rope_parameters"), Mapping):
        params, style = dict(hf["rope_parameters"]), "rope_parameters"
        theta = params.pop("rope_theta", hf.get("rope_theta", default_theta))
    else:
        params, style = dict(hf.get("rope_scaling") or {}), "rope_scaling"
        theta = hf.get("rope_theta", default_theta)
    rope_type = params.pop("rope_type", params.pop("type", "default"))
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise ValueError(f"rope_type={rope_type!r} is not supported; valid: {SUPPORTED_ROPE_TYPES}")
    if rope_type == "default":
        return float(theta), None, style
    if params.get("factor") is None:
        raise ValueError(f"rope_type={rope_type!r} is missing required field 'factor'")
    original = params.get("original_max_position_embeddings")
    scaling = RopeScaling(
        rope_type=rope_type,
        factor=float(params["factor"]),
        low_freq_factor=None if params.get("low_freq_factor") is None else float(params["low_freq_factor"]),
        high_freq_factor=None if params.get("high_freq_factor") is None else float(params["high_freq_factor"]),
        original_max_position_embeddings=None if original is None else int(original),
    )
    return float(theta), scaling, style
