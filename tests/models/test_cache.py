"""KV-cache prefill + decode steps reproduce the full (cache-free) forward pass."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import forward, init_cache
from tests.models.hf_reference import hf_model, our_config_and_params, rel_err


@pytest.mark.parametrize("name", ["qwen3_qk_norm", "llama3_rope_untied"])
def test_left_padded_prefill_then_decode_equals_full_forward(name):
    cfg, params = our_config_and_params(hf_model(name))
    rng = np.random.RandomState(4)
    prompt_lengths, steps = np.array([5, 9, 7]), 4
    width = int(prompt_lengths.max())
    sequences = [rng.randint(0, cfg.vocab_size, size=n + steps) for n in prompt_lengths]

    # Sampler convention: prompts left-padded to a common width, generated tokens appended.
    prompts = np.zeros((3, width), np.int32)
    prompt_mask = np.zeros((3, width), np.int32)
    for row, (seq, n) in enumerate(zip(sequences, prompt_lengths)):
        prompts[row, width - n:], prompt_mask[row, width - n:] = seq[:n], 1

    step = jax.jit(lambda p, tokens, mask, cache: forward(p, cfg, tokens, attention_mask=mask, cache=cache))
    cache = init_cache(cfg, batch=3, max_len=width + steps)
    prefill_logits, cache = step(params, jnp.asarray(prompts), jnp.asarray(prompt_mask), cache)
    decode_logits = []
    for t in range(steps):
        next_tokens = np.array([[seq[n + t]] for seq, n in zip(sequences, prompt_lengths)], np.int32)
        logits, cache = step(params, jnp.asarray(next_tokens), jnp.ones((3, 1), jnp.int32), cache)
        decode_logits.append(np.asarray(logits)[:, 0])
    assert int(cache["end"]) == width + steps
    np.testing.assert_array_equal(cache["next_pos"], prompt_lengths + steps)

    # Reference: the same sequences right-padded, no cache (checked against transformers elsewhere).
    full_len = width + steps
    padded = np.zeros((3, full_len), np.int32)
    mask = np.zeros((3, full_len), np.int32)
    for row, seq in enumerate(sequences):
        padded[row, :len(seq)], mask[row, :len(seq)] = seq, 1
    reference, _ = forward(params, cfg, jnp.asarray(padded), attention_mask=jnp.asarray(mask))
    reference = np.asarray(reference)
    for row, n in enumerate(prompt_lengths):
        assert rel_err(np.asarray(prefill_logits)[row, width - n:], reference[row, :n]) <= 1e-5
        for t in range(steps):
            assert rel_err(decode_logits[t][row], reference[row, n + t]) <= 1e-5


def test_cache_overflow_and_packing_are_rejected():
    cfg, params = our_config_and_params(hf_model("llama_tied"))
    cache = init_cache(cfg, batch=1, max_len=4)
    with pytest.raises(ValueError, match="cache overflow: 0 slots filled \\+ 5 new tokens > max_len 4"):
        forward(params, cfg, jnp.zeros((1, 5), jnp.int32), cache=cache)
    with pytest.raises(ValueError, match="segment_ids"):
        forward(params, cfg, jnp.zeros((1, 2), jnp.int32), segment_ids=jnp.ones((1, 2), jnp.int32), cache=cache)
    with pytest.raises(ValueError, match="cache holds 1 rows but tokens have batch 2"):
        forward(params, cfg, jnp.zeros((2, 2), jnp.int32), cache=cache)


def test_init_cache_layout():
    cfg, _ = our_config_and_params(hf_model("qwen3_qk_norm"))
    cache = init_cache(cfg, batch=2, max_len=6, dtype="bf16")
    assert cache["k"].shape == cache["v"].shape == (2, 2, 6, 2, 16) and cache["k"].dtype == jnp.bfloat16
    assert cache["mask"].shape == (2, 6) and not cache["mask"].any() and int(cache["end"]) == 0
