"""GGUF loading on tiny files laid out like llama.cpp's converter writes them."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bridge import load_gguf, undo_rotary_permutation
from jaxrl_llm.models import forward, params_to_hf
from tests.bridge.tiny import rel_err, state_numpy, tiny_model, tokens, torch_logits
from tests.bridge.tiny_gguf import TOKENS, write_gguf


def test_undo_rotary_permutation_by_hand():
    # 2 heads of dim 4. llama.cpp stores HF rows (0, 1 | 2, 3) of a head as (0, 2, 1, 3).
    llama_cpp_rows = np.array([0, 2, 1, 3, 4, 6, 5, 7], np.float32)
    np.testing.assert_array_equal(undo_rotary_permutation(llama_cpp_rows, 2), np.arange(8))
    matrix = np.stack([llama_cpp_rows, 10 * llama_cpp_rows], axis=1)  # [rows, in]: rows move, columns do not
    np.testing.assert_array_equal(undo_rotary_permutation(matrix, 2), np.stack([np.arange(8), 10 * np.arange(8)], 1))


@pytest.mark.parametrize("family, arch", [("llama_untied_attention_bias", "llama"), ("qwen2_tied", "qwen2"),
                                          ("qwen3_qk_norm", "qwen3")])
def test_tiny_gguf_loads_like_transformers(tmp_path, family, arch):
    """llama: q/k rows (and biases) permuted in the file must be un-permuted; qwen2/3: stored as is."""
    model = tiny_model(family)
    state = state_numpy(model)
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    config = model.config.to_dict()
    config["head_dim"] = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    write_gguf(tmp_path / "tiny.gguf", config, state, arch=arch)
    cfg, params, _ = load_gguf(tmp_path / "tiny.gguf")
    assert (cfg.family, cfg.tie_word_embeddings, cfg.num_kv_heads) == (arch, model.config.tie_word_embeddings, 2)
    ours = params_to_hf(jax.tree_util.tree_map(np.asarray, params), cfg)
    assert set(ours) == set(state)
    for name, array in state.items():
        np.testing.assert_array_equal(ours[name], array, err_msg=name)
    toks = tokens()
    assert rel_err(forward(params, cfg, jnp.asarray(toks))[0], torch_logits(model, toks)) < 1e-5


def test_tiny_gguf_tokenizer(tmp_path):
    model = tiny_model("qwen2_tied")
    state = {k: v for k, v in state_numpy(model).items() if k != "lm_head.weight"}
    write_gguf(tmp_path / "tiny.gguf", {**model.config.to_dict(), "head_dim": 16}, state, arch="qwen2")
    _, _, bundle = load_gguf(tmp_path / "tiny.gguf")
    encoded = bundle.tokenizer.encode("hello<s>")
    # "he" is merged (the one merge), the rest are single bytes, "<s>" is a special token.
    assert encoded.tokens == ["he", "l", "l", "o", "<s>"]
    assert encoded.ids == [TOKENS.index(t) for t in encoded.tokens]
    assert (bundle.bos_token, bundle.eos_token) == ("<s>", "</s>")
    config = bundle.tokenizer_config()
    assert config["chat_template"] == "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    assert config["added_tokens_decoder"]["0"]["special"] is True


def test_load_gguf_in_bfloat16(tmp_path):
    model = tiny_model("qwen3_qk_norm")
    write_gguf(tmp_path / "tiny.gguf", model.config.to_dict(), state_numpy(model), arch="qwen3")
    cfg32, params32, _ = load_gguf(tmp_path / "tiny.gguf")
    cfg16, params16, _ = load_gguf(tmp_path / "tiny.gguf", dtype="bf16")
    assert cfg16.param_dtype == "bfloat16" and cfg16 == cfg32.with_dtypes(param_dtype="bfloat16")
    for x32, x16 in zip(jax.tree_util.tree_leaves(params32), jax.tree_util.tree_leaves(params16)):
        assert x16.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(x16), np.asarray(x32).astype(jnp.bfloat16))
