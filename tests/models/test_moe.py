"""Qwen3-MoE: logits against transformers' Qwen3MoeForCausalLM, the KV-cache path, the config."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, forward, init_cache, init_params
from tests.models.hf_reference import MOE_CONFIGS, hf_logits, hf_model, our_config_and_params, rel_err

TOKENS = np.random.RandomState(0).randint(0, 97, size=(2, 40))


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_moe_logits_match_transformers(name):
    model = hf_model(name)
    cfg, params = our_config_and_params(model)
    assert cfg.family == model.config.model_type and cfg.is_moe
    assert cfg.norm_topk_prob == getattr(model.config, "norm_topk_prob", True)  # Mixtral always renormalises
    logits, cache = forward(params, cfg, jnp.asarray(TOKENS))
    assert cache is None and logits.dtype == jnp.float32
    assert rel_err(logits, hf_logits(model, TOKENS)) <= 1e-5


def _moe_hf_config(**changes):
    """A Qwen3-MoE config.json as the hub writes it (Qwen3-30B-A3B's keys, tiny sizes)."""
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 11,
              "hidden_size": 8, "intermediate_size": 12, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 4, "num_experts": 5, "num_experts_per_tok": 2,
              "moe_intermediate_size": 6, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
              "router_aux_loss_coef": 0.001, "output_router_logits": False, "tie_word_embeddings": False,
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "bos_token_id": 3}
    return {**config, **changes}


def test_moe_config_reads_and_writes_the_hf_keys():
    cfg = DecoderConfig.from_hf(_moe_hf_config())
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (5, 2, 6, True)
    assert cfg.qk_norm and cfg.family == "qwen3_moe"
    out = cfg.to_hf()
    for key, value in _moe_hf_config().items():  # every key written back with its value
        assert out[key] == value, key
    # transformers 5's save_pretrained writes num_local_experts instead of num_experts
    renamed = {k: v for k, v in _moe_hf_config(num_local_experts=5).items() if k != "num_experts"}
    again = DecoderConfig.from_hf(renamed)
    assert again == cfg and "num_local_experts" not in again.to_hf() and again.to_hf()["num_experts"] == 5


@pytest.mark.parametrize("changes, message", [
    (dict(decoder_sparse_step=2), "decoder_sparse_step=2 is not supported; valid: 1"),
    (dict(mlp_only_layers=[1]), r"mlp_only_layers=\[1\] is not supported; valid: \[\]"),
    (dict(num_experts_per_tok=6), "num_experts_per_tok=6 must be <= num_experts=5"),
    (dict(num_experts=0), "num_experts=0 must be a positive int"),
])
def test_moe_config_refuses_what_it_does_not_model(changes, message):
    with pytest.raises(ValueError, match=message):
        DecoderConfig.from_hf(_moe_hf_config(**changes))


def test_moe_params_layout_and_counts():
    cfg = DecoderConfig.from_hf(_moe_hf_config())
    shapes = jax.tree_util.tree_map(lambda x: x.shape, init_params(cfg, jax.random.PRNGKey(0)))
    # Written from the layout contract (D=8, E=5, F=6, nL=3, hd=4), not from the code.
    assert shapes == {
        "embed": (11, 8), "final_norm": (8,), "lm_head": (8, 11),
        "layers": {"input_norm": (3, 8), "q_proj": (3, 8, 16), "k_proj": (3, 8, 8), "v_proj": (3, 8, 8),
                   "o_proj": (3, 16, 8), "q_norm": (3, 4), "k_norm": (3, 4), "post_norm": (3, 8),
                   "router": (3, 8, 5), "expert_gate": (3, 5, 8, 6), "expert_up": (3, 5, 8, 6),
                   "expert_down": (3, 5, 6, 8)},
    }
    attention = 8 + 8 * 16 + 2 * 8 * 8 + 16 * 8 + 8 + 2 * 4  # norms, q, k+v, o, post_norm, q/k norms
    per_layer_total = attention + 8 * 5 + 5 * 3 * 8 * 6
    per_layer_active = attention + 8 * 5 + 2 * 3 * 8 * 6
    assert cfg.num_params() == 11 * 8 * 2 + 8 + 3 * per_layer_total == sum(
        int(np.prod(s)) for s in jax.tree_util.tree_leaves(shapes, is_leaf=lambda x: isinstance(x, tuple)))
    assert cfg.num_active_params() == 11 * 8 * 2 + 8 + 3 * per_layer_active


@pytest.mark.parametrize("name", sorted(MOE_CONFIGS))
def test_moe_prefill_then_decode_equals_full_forward(name):
    cfg, params = our_config_and_params(hf_model(name))
    rng = np.random.RandomState(4)
    prompt_lengths, steps = np.array([5, 9, 7]), 4
    width = int(prompt_lengths.max())
    sequences = [rng.randint(0, cfg.vocab_size, size=n + steps) for n in prompt_lengths]
    prompts, prompt_mask = np.zeros((3, width), np.int32), np.zeros((3, width), np.int32)
    for row, (seq, n) in enumerate(zip(sequences, prompt_lengths)):  # left-padded, as the sampler does
        prompts[row, width - n:], prompt_mask[row, width - n:] = seq[:n], 1
    step = jax.jit(lambda p, tokens, mask, cache: forward(p, cfg, tokens, attention_mask=mask, cache=cache))
    cache = init_cache(cfg, batch=3, max_len=width + steps)
    prefill, cache = step(params, jnp.asarray(prompts), jnp.asarray(prompt_mask), cache)
    decode = []
    for t in range(steps):
        next_tokens = np.array([[seq[n + t]] for seq, n in zip(sequences, prompt_lengths)], np.int32)
        logits, cache = step(params, jnp.asarray(next_tokens), jnp.ones((3, 1), jnp.int32), cache)
        decode.append(np.asarray(logits)[:, 0])
    padded, mask = np.zeros((3, width + steps), np.int32), np.zeros((3, width + steps), np.int32)
    for row, seq in enumerate(sequences):
        padded[row, :len(seq)], mask[row, :len(seq)] = seq, 1
    reference = np.asarray(forward(params, cfg, jnp.asarray(padded), attention_mask=jnp.asarray(mask))[0])
    for row, n in enumerate(prompt_lengths):
        assert rel_err(np.asarray(prefill)[row, width - n:], reference[row, :n]) <= 1e-5
        for t in range(steps):
            assert rel_err(decode[t][row], reference[row, n + t]) <= 1e-5


def test_qwen3_30b_a3b_config_counts_its_published_sizes():
    """Qwen3-30B-A3B's config.json (HF hub): 30.5B parameters, 3.3B activated (its model card)."""
    cfg = DecoderConfig.from_hf(_moe_hf_config(
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
        num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
        max_position_embeddings=40960, rms_norm_eps=1e-6))
    assert cfg.num_params() == pytest.approx(30.5e9, rel=5e-3)
    assert cfg.num_active_params() == pytest.approx(3.3e9, rel=2e-2)
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))  # nothing allocated
    assert sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(shapes)) == cfg.num_params()
    assert shapes["layers"]["expert_down"].shape == (48, 128, 768, 2048)


def test_mixtral_config_reads_and_writes_its_keys():
    hf = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": 11, "hidden_size": 8,
          "intermediate_size": 12, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": None, "router_jitter_noise": 0.0,
          "rope_theta": 1e6, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
    cfg = DecoderConfig.from_hf(hf)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (8, 2, 12, True)
    assert not cfg.qk_norm and not cfg.qkv_bias
    out = cfg.to_hf()
    assert all(out[key] == value for key, value in hf.items()) and "num_experts" not in out
    with pytest.raises(ValueError, match="sliding_window=4096 is not supported; valid: null"):
        DecoderConfig.from_hf({**hf, "sliding_window": 4096})
