"""Decoder logits against transformers (the reference), params layout, HF name map."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, forward, init_params, params_to_hf, param_shapes
from jaxrl_llm.models.hf_names import params_from_hf
from tests.models.hf_reference import (SMOLLM2_CONFIG, TINY_CONFIGS, hf_logits, hf_model, our_config_and_params,
                                      rel_err, torch)

TOKENS = np.random.RandomState(0).randint(0, 97, size=(2, 40))


@pytest.mark.parametrize("name", sorted(TINY_CONFIGS))
def test_logits_match_transformers(name):
    model = hf_model(name)
    cfg, params = our_config_and_params(model)
    logits, cache = forward(params, cfg, jnp.asarray(TOKENS))
    assert cache is None and logits.dtype == jnp.float32
    assert rel_err(logits, hf_logits(model, TOKENS)) <= 1e-5


@pytest.mark.parametrize("name", ["llama3_rope_untied", "qwen3_qk_norm"])
def test_right_padded_batch_matches_transformers(name):
    model = hf_model(name)
    cfg, params = our_config_and_params(model)
    lengths = np.array([40, 23])
    mask = (np.arange(40)[None, :] < lengths[:, None]).astype(np.int32)
    tokens = np.where(mask == 1, TOKENS, 0)
    ours, _ = forward(params, cfg, jnp.asarray(tokens), attention_mask=jnp.asarray(mask))
    ref = hf_logits(model, tokens, attention_mask=mask)
    valid = mask.astype(bool)
    assert np.all(np.isfinite(np.asarray(ours)))
    assert rel_err(np.asarray(ours)[valid], ref[valid]) <= 1e-5
    # The same rows left-padded: default positions still count 0, 1, ... on the real tokens.
    left_tokens, left_mask = np.zeros_like(tokens), np.zeros_like(mask)
    for row, n in enumerate(lengths):
        left_tokens[row, 40 - n:], left_mask[row, 40 - n:] = tokens[row, :n], 1
    left, _ = forward(params, cfg, jnp.asarray(left_tokens), attention_mask=jnp.asarray(left_mask))
    assert rel_err(np.asarray(left)[left_mask.astype(bool)], ref[valid]) <= 1e-5


def test_packed_segments_equal_separate_sequences():
    model = hf_model("qwen2_qkv_bias")
    cfg, params = our_config_and_params(model)
    first, second = TOKENS[0, :15], TOKENS[1, :20]
    packed = np.concatenate([first, second, np.zeros(5, int)])[None]
    segments = np.array([[1] * 15 + [2] * 20 + [0] * 5])
    ours, _ = forward(params, cfg, jnp.asarray(packed), segment_ids=jnp.asarray(segments))
    ours = np.asarray(ours)[0]
    assert rel_err(ours[:15], hf_logits(model, first[None])[0]) <= 1e-5
    assert rel_err(ours[15:35], hf_logits(model, second[None])[0]) <= 1e-5


def test_explicit_positions_match_transformers_position_ids():
    model = hf_model("llama_tied")
    cfg, params = our_config_and_params(model)
    positions = np.broadcast_to(np.arange(7, 47), TOKENS.shape).copy()
    ours, _ = forward(params, cfg, jnp.asarray(TOKENS), positions=jnp.asarray(positions))
    assert rel_err(ours, hf_logits(model, TOKENS, positions=positions)) <= 1e-5


def test_init_params_has_the_documented_layout():
    cfg = DecoderConfig.from_hf({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 11, "hidden_size": 8,
                                 "intermediate_size": 12, "num_hidden_layers": 3, "num_attention_heads": 4,
                                 "num_key_value_heads": 2, "tie_word_embeddings": False})
    params = init_params(cfg, jax.random.PRNGKey(0))
    shapes = jax.tree_util.tree_map(lambda x: x.shape, params)
    # Written out from the layout contract (hd = 8 / 4 = 2), not from the code.
    assert shapes == {
        "embed": (11, 8),
        "layers": {"input_norm": (3, 8), "q_proj": (3, 8, 8), "k_proj": (3, 8, 4), "v_proj": (3, 8, 4),
                   "o_proj": (3, 8, 8), "q_bias": (3, 8), "k_bias": (3, 4), "v_bias": (3, 4),
                   "post_norm": (3, 8), "gate_proj": (3, 8, 12), "up_proj": (3, 8, 12), "down_proj": (3, 12, 8)},
        "final_norm": (8,),
        "lm_head": (8, 11),
    }
    assert type(params) is dict and type(params["layers"]) is dict
    # Distinct layers get distinct random weights; norms start at one, biases at zero.
    assert not np.allclose(params["layers"]["q_proj"][0], params["layers"]["q_proj"][1])
    assert np.all(params["layers"]["input_norm"] == 1) and np.all(params["layers"]["q_bias"] == 0)
    assert params["embed"].dtype == jnp.float32
    bf16_shapes = param_shapes(cfg, "bf16")
    assert {x.dtype for x in jax.tree_util.tree_leaves(bf16_shapes)} == {jnp.dtype(jnp.bfloat16)}


def test_params_to_hf_loads_into_transformers_with_same_logits():
    """The reverse direction: our random init, written with HF names, runs identically in transformers."""
    model = hf_model("qwen3_qk_norm")
    cfg = DecoderConfig.from_hf(model.config.to_dict())
    params = init_params(cfg, jax.random.PRNGKey(3))
    tensors = params_to_hf(params, cfg)
    missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()}, strict=False)
    assert not missing and not unexpected
    ours, _ = forward(params, cfg, jnp.asarray(TOKENS))
    assert rel_err(ours, hf_logits(model, TOKENS)) <= 1e-5
    back = params_from_hf(tensors, cfg)
    jax.tree_util.tree_map(np.testing.assert_array_equal, back, jax.tree_util.tree_map(np.asarray, params))


def test_params_from_hf_names_missing_and_unexpected_tensors():
    model = hf_model("llama_tied")
    cfg = DecoderConfig.from_hf(model.config.to_dict())
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    incomplete = {k: v for k, v in state.items() if k != "model.layers.1.mlp.up_proj.weight"}
    with pytest.raises(KeyError, match="model.layers.1.mlp.up_proj.weight"):
        params_from_hf(incomplete, cfg)
    with pytest.raises(KeyError, match="model.layers.0.self_attn.q_proj.bias"):
        params_from_hf({**state, "model.layers.0.self_attn.q_proj.bias": np.zeros(32)}, cfg)


def test_smollm2_config_shapes_and_parameter_count():
    """SmolLM2-135M (ENVIRONMENT.md: 134.5M params) traced abstractly: no weights allocated."""
    cfg = DecoderConfig.from_hf(SMOLLM2_CONFIG)
    shapes = param_shapes(cfg)
    count = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes))
    assert count == cfg.num_params() == 134_515_008
    assert "lm_head" not in shapes and shapes["layers"]["k_proj"].shape == (30, 576, 192)
    out = jax.eval_shape(lambda p, t: forward(p, cfg, t)[0], shapes, jax.ShapeDtypeStruct((2, 8), jnp.int32))
    assert out.shape == (2, 8, 49152) and out.dtype == jnp.float32
