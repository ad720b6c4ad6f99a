"""DecoderConfig <-> HF config.json: families, rope styles, round trips, errors."""
import json

import pytest

from jaxrl_llm.models import DecoderConfig, RopeScaling
from tests.models.hf_reference import SMOLLM2_CONFIG

transformers = pytest.importorskip("transformers")

TINY = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2)


def test_smollm2_config_fields():
    cfg = DecoderConfig.from_hf(SMOLLM2_CONFIG)
    assert (cfg.family, cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == \
        ("llama", 576, 30, 9, 3, 64)
    assert (cfg.vocab_size, cfg.tie_word_embeddings, cfg.rope_theta, cfg.rms_norm_eps) == (49152, True, 1e5, 1e-5)
    assert cfg.rope_scaling is None and not cfg.qkv_bias and not cfg.o_bias and not cfg.qk_norm


def test_smollm2_config_round_trips_exactly():
    cfg = DecoderConfig.from_hf(SMOLLM2_CONFIG)
    hf = cfg.to_hf()
    assert hf == SMOLLM2_CONFIG
    assert DecoderConfig.from_hf(hf) == cfg


@pytest.mark.parametrize("config_cls, overrides, expected", [
    ("LlamaConfig", {}, dict(family="llama", qkv_bias=False, o_bias=False, qk_norm=False, head_dim=8)),
    ("LlamaConfig", {"attention_bias": True}, dict(family="llama", qkv_bias=True, o_bias=True, qk_norm=False)),
    ("Qwen2Config", {}, dict(family="qwen2", qkv_bias=True, o_bias=False, qk_norm=False)),
    ("Qwen3Config", {"head_dim": 16}, dict(family="qwen3", qkv_bias=False, o_bias=False, qk_norm=True,
                                           head_dim=16)),
])
def test_families_from_transformers_configs(config_cls, overrides, expected):
    original = getattr(transformers, config_cls)(**TINY, **overrides)
    cfg = DecoderConfig.from_hf(original.to_dict())
    for name, value in expected.items():
        assert getattr(cfg, name) == value, name
    # Our output reloads in transformers as the same architecture.
    reloaded = getattr(transformers, config_cls).from_dict(cfg.to_hf())
    for key in ("hidden_size", "num_key_value_heads", "head_dim", "rms_norm_eps", "tie_word_embeddings"):
        assert getattr(reloaded, key, None) == getattr(original, key, None), key
    assert reloaded.rope_parameters == original.rope_parameters


def test_llama3_rope_scaling_both_config_styles():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    old_style = {"architectures": ["LlamaForCausalLM"], **TINY, "rope_theta": 500000.0,
                 "rope_scaling": {"rope_type": "llama3", **scaling}}
    new_style = {"architectures": ["LlamaForCausalLM"], **TINY,
                 "rope_parameters": {"rope_theta": 500000.0, "rope_type": "llama3", **scaling}}
    a, b = DecoderConfig.from_hf(old_style), DecoderConfig.from_hf(new_style)
    assert a == b and a.rope_theta == 500000.0
    assert a.rope_scaling == RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
    assert a.to_hf()["rope_scaling"] == old_style["rope_scaling"] and "rope_parameters" not in a.to_hf()
    assert b.to_hf()["rope_parameters"] == new_style["rope_parameters"] and "rope_scaling" not in b.to_hf()
    # Older configs spell the key "type".
    legacy = {**old_style, "rope_scaling": {"type": "llama3", **scaling}}
    assert DecoderConfig.from_hf(legacy) == a


def test_from_hf_reads_a_file_or_a_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2_CONFIG))
    expected = DecoderConfig.from_hf(SMOLLM2_CONFIG)
    assert DecoderConfig.from_hf(tmp_path) == expected
    assert DecoderConfig.from_hf(str(tmp_path / "config.json")) == expected


def test_dtype_policy_aliases_and_errors():
    cfg = DecoderConfig.from_hf(SMOLLM2_CONFIG, param_dtype="fp32", compute_dtype="bf16")
    assert (cfg.param_dtype, cfg.compute_dtype) == ("float32", "bfloat16")
    assert cfg.with_dtypes(compute_dtype="fp16").compute_dtype == "float16"
    with pytest.raises(ValueError, match=r"compute_dtype='int8'.*bfloat16/bf16"):
        cfg.with_dtypes(compute_dtype="int8")
    with pytest.raises(ValueError, match="param_dtype='float64'"):
        DecoderConfig.from_hf(SMOLLM2_CONFIG, param_dtype="float64")


def test_unknown_architecture_names_it_and_the_supported_ones():
    with pytest.raises(ValueError, match=r"'MistralForCausalLM'.*LlamaForCausalLM.*Qwen2ForCausalLM.*Qwen3"):
        DecoderConfig.from_hf({**SMOLLM2_CONFIG, "architectures": ["MistralForCausalLM"]})
    with pytest.raises(ValueError, match=r"model_type='gpt2'"):
        DecoderConfig.from_hf({**TINY, "model_type": "gpt2"})


@pytest.mark.parametrize("field", ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads"])
def test_missing_required_field_is_named(field):
    config = {k: v for k, v in SMOLLM2_CONFIG.items() if k != field}
    with pytest.raises(ValueError, match=field):
        DecoderConfig.from_hf(config)


def test_qwen3_requires_explicit_head_dim():
    with pytest.raises(ValueError, match="head_dim"):
        DecoderConfig.from_hf({"architectures": ["Qwen3ForCausalLM"], **TINY})


@pytest.mark.parametrize("change, message", [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, r"rope_type='yarn'.*'default', 'linear', 'llama3'"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, "low_freq_factor"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"use_sliding_window": True}, "sliding-window"),
    ({"num_key_value_heads": 4}, "num_heads=9 must be a multiple of num_kv_heads=4"),
])
def test_unsupported_features_are_rejected(change, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig.from_hf({**SMOLLM2_CONFIG, **change})


def test_config_is_hashable_and_extras_do_not_change_identity():
    a = DecoderConfig.from_hf(SMOLLM2_CONFIG)
    b = DecoderConfig.from_hf({**SMOLLM2_CONFIG, "bos_token_id": 7})
    assert a == b and hash(a) == hash(b) and b.to_hf()["bos_token_id"] == 7


def test_bias_switches_must_match_the_family():
    base = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1,
                head_dim=4)
    with pytest.raises(ValueError, match="family='qwen2' needs qkv_bias=True"):
        DecoderConfig(**base, family="qwen2")
    with pytest.raises(ValueError, match="qkv_bias=True and o_bias=False must be equal"):
        DecoderConfig(**base, family="llama", qkv_bias=True)
