"""The real SmolLM2-135M-Instruct: GGUF -> our params/decoder vs transformers, export, tokenizer."""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.bridge import load_hf_dir, smollm2_gguf_path, smollm2_hf_dir
from jaxrl_llm.models import forward, params_to_hf

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["<|im_start|>user\nWhat is 7 + 5? Answer with just the number.<|im_end|>\n<|im_start|>assistant\n",
           "The quick brown fox jumps over the lazy dog. In 1969, 3 astronauts flew to"]


def _rel_err(ours, ref) -> float:
    ours, ref = np.asarray(ours, np.float64), np.asarray(ref, np.float64)
    return float(np.linalg.norm(ours - ref) / np.linalg.norm(ref))


def _token_batch(tokenizer, length=22) -> np.ndarray:
    rows = [tokenizer.tokenizer.encode(text).ids[:length] for text in PROMPTS]
    assert all(len(row) == length for row in rows)
    return np.asarray(rows, np.int32)


def _our_logits(cfg, params, tokens):
    return np.asarray(jax.jit(lambda p, t: forward(p, cfg, t)[0])(params, jnp.asarray(tokens)))


def _torch_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens, dtype=torch.long)).logits.numpy()


def test_config_matches_smollm2_facts(smollm2):
    cfg, _, _ = smollm2
    # ENVIRONMENT.md: hidden 576, 30 layers, 9 heads, 3 KV heads, vocab 49152, tied, 134.5M parameters.
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size) == (576, 30, 9, 3, 49152)
    assert cfg.tie_word_embeddings and cfg.family == "llama" and cfg.rope_theta == 100000.0
    assert round(cfg.num_params() / 1e6, 1) == 134.5


def test_dequantized_weights_equal_transformers_gguf_loader(smollm2, hf_gguf_model):
    """Our numpy dequantization + q/k un-permutation vs transformers' (torch) GGUF path, tensor by tensor."""
    cfg, params, _ = smollm2
    reference = {k: v for k, v in hf_gguf_model.state_dict().items() if k != "lm_head.weight"}  # tied
    ours = params_to_hf(jax.tree_util.tree_map(np.asarray, params), cfg)
    assert set(ours) == set(reference)
    for name, tensor in reference.items():
        np.testing.assert_array_equal(ours[name], tensor.numpy(), err_msg=name)


def test_logits_match_transformers_on_gguf_weights(smollm2, hf_gguf_model):
    cfg, params, tokenizer = smollm2
    model = hf_gguf_model
    tokens = _token_batch(tokenizer)
    assert _rel_err(_our_logits(cfg, params, tokens), _torch_logits(model, tokens)) <= 1e-4


def test_exported_dir_loads_in_transformers_with_same_logits(smollm2, smollm2_dir, hf_gguf_model):
    cfg, params, tokenizer = smollm2
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    assert type(model).__name__ == "LlamaForCausalLM"
    for name, tensor in hf_gguf_model.state_dict().items():  # exact float32 round trip through safetensors
        torch.testing.assert_close(model.state_dict()[name], tensor, rtol=0, atol=0, msg=name)
    tokens = _token_batch(tokenizer)
    assert _rel_err(_our_logits(cfg, params, tokens), _torch_logits(model, tokens)) <= 1e-4


def test_exported_dir_round_trips_exactly(smollm2, smollm2_dir):
    cfg, params, _ = smollm2
    cfg2, params2 = load_hf_dir(smollm2_dir)
    assert cfg2 == cfg
    jax.tree_util.tree_map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), params, params2)


def test_smollm2_hf_dir_is_cached_and_reused(smollm2_dir, smollm2_cache_root):
    weights = os.path.join(smollm2_dir, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    assert smollm2_hf_dir(smollm2_cache_root) == smollm2_dir
    assert os.stat(weights).st_mtime_ns == before  # not rewritten
    assert os.path.basename(smollm2_dir).startswith("smollm2-135m-instruct-")
    assert sorted(os.listdir(smollm2_dir)) == sorted([
        "config.json", "generation_config.json", "model.safetensors", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json"])
    assert not [n for n in os.listdir(smollm2_cache_root) if n.startswith(".")]  # no staging leftovers


# ---------------------------------------------------------------- tokenizer
TEXTS = ["Hello world!", " 123 4567.89 -0.5e10", "  leading spaces\n\n\ttabs\r\n", "naïve café 日本語 🤖 Ωμέγα",
         "<|im_start|>user\nhi<|im_end|>\n", "x<|endoftext|>y<repo_name>z", "it's they're I'LL we've",
         "a" * 40, "def f(x):\n    return x**2  # comment", "", "   ", "<|im_start|", "Ġ already byte-level?"]
CONVERSATIONS = [
    [{"role": "user", "content": "What is 2+3?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
     {"role": "assistant", "content": "hello"}, {"role": "user", "content": "What is 12 + 30?"}],
]


@pytest.fixture(scope="module")
def reference_tokenizer():
    path = smollm2_gguf_path()
    return transformers.AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.fixture(scope="module")
def exported_tokenizer(smollm2_dir):
    return transformers.AutoTokenizer.from_pretrained(smollm2_dir)


def test_tokenizer_matches_transformers_gguf_tokenizer(exported_tokenizer, reference_tokenizer):
    for text in TEXTS:
        ours = exported_tokenizer(text)["input_ids"]
        assert ours == reference_tokenizer(text)["input_ids"], text
        assert exported_tokenizer.decode(ours) == reference_tokenizer.decode(ours) == text
    for attr in ("bos_token", "eos_token", "pad_token", "unk_token", "bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(exported_tokenizer, attr) == getattr(reference_tokenizer, attr), attr
    assert (exported_tokenizer.bos_token, exported_tokenizer.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_chat_template_matches_transformers_gguf_tokenizer(exported_tokenizer, reference_tokenizer):
    for messages in CONVERSATIONS:
        for add_generation_prompt in (True, False):
            kwargs = dict(add_generation_prompt=add_generation_prompt)
            text = exported_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
            assert text == reference_tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
            ours = exported_tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
            ref = reference_tokenizer.apply_chat_template(messages, tokenize=True, **kwargs)
            assert dict(ours)["input_ids"] == dict(ref)["input_ids"]
    text = exported_tokenizer.apply_chat_template(CONVERSATIONS[0], tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                    "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")


def test_numeric_characters_split_like_llama_cpp(exported_tokenizer):
    """GGUF tokenizer.ggml.pre = 'smollm': llama.cpp first splits every \\p{N} character alone (as the
    original HF tokenizer's Digits(individual_digits) step). transformers' GGUF converter drops that
    step, so only here do the two differ: ' ½' must be [' ', '½'], not [' ' + first byte, second byte]."""
    vocab = exported_tokenizer.get_vocab()
    # GPT-2's byte-to-unicode map keeps bytes 0xAE..0xFF as themselves: UTF-8 of '½' (C2 BD) -> 'Â½'.
    byte_level_half = "".join(map(chr, "½".encode()))
    assert exported_tokenizer(" ½")["input_ids"] == [vocab["Ġ"], vocab[byte_level_half]]


_VLLM_TOKENIZER_SCRIPT = """
import json, sys
from vllm.tokenizers.registry import get_tokenizer
tokenizer = get_tokenizer(sys.argv[1])
texts, conversations = json.loads(sys.stdin.read())
print(json.dumps({
    "ids": [tokenizer(text)["input_ids"] for text in texts],
    "chat": [tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in conversations],
    "special": [tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token],
}))
"""


@pytest.mark.vllm
def test_vllm_loads_the_exported_tokenizer(smollm2_dir, exported_tokenizer):
    """vLLM's own tokenizer loader (its pinned transformers) on our directory gives our ids."""
    import json
    import subprocess

    from jaxrl_llm.rollout.vllm_env import vllm_python
    from tests.vllm_required import require_vllm_env

    require_vllm_env()
    result = subprocess.run([str(vllm_python()), "-c", _VLLM_TOKENIZER_SCRIPT, smollm2_dir],
                            input=json.dumps([TEXTS, CONVERSATIONS]), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    served = json.loads(result.stdout.strip().splitlines()[-1])
    assert served["ids"] == [exported_tokenizer(text)["input_ids"] for text in TEXTS]
    assert served["chat"] == [exported_tokenizer.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
                              for m in CONVERSATIONS]
    assert served["special"] == ["<|im_start|>", "<|im_end|>", "<|im_end|>"]
