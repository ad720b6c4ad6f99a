"""Chunked per-token logprobs: equal to the full softmax, float32 always, bounded memory."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, forward, lm_head_logits, token_logprobs
from tests.models.hf_reference import hf_logits, hf_model, our_config_and_params, torch

TOKENS = np.random.RandomState(1).randint(0, 97, size=(3, 40))


def naive_logprobs(logits, tokens, temperature):
    """Full [B, T, V] log-softmax (float32) of the next-token targets, and the entropy."""
    logp_all = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32) / temperature, axis=-1)
    logp = jnp.take_along_axis(logp_all, tokens[:, 1:, None], axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


@pytest.fixture(scope="module")
def untied():
    model = hf_model("llama3_rope_untied")
    return (model, *our_config_and_params(model))


@pytest.fixture(scope="module")
def tied():
    model = hf_model("qwen2_qkv_bias")
    return (model, *our_config_and_params(model))


# chunk 1: one position per chunk; 7 does not divide T-1 = 39; 128 > T (a single chunk).
@pytest.mark.parametrize("which, chunk_size, temperature", [("untied", 7, 0.7), ("tied", 1, 1.0), ("tied", 128, 0.7)])
def test_chunked_equals_full_softmax(which, chunk_size, temperature, request):
    _, cfg, params = request.getfixturevalue(which)
    tokens = jnp.asarray(TOKENS)
    logp, entropy = jax.jit(lambda p, t: token_logprobs(p, cfg, t, temperature=temperature, chunk_size=chunk_size,
                                                         return_entropy=True))(params, tokens)
    ref_logp, ref_entropy = jax.jit(lambda p, t: naive_logprobs(forward(p, cfg, t)[0], t, temperature))(params, tokens)
    assert logp.shape == entropy.shape == (3, 39) and logp.dtype == entropy.dtype == jnp.float32
    # 1e-6 absolute or relative: the per-chunk and the full matmul round logits differently
    # in the last float32 bit, so values of magnitude ~5 can differ by a few 1e-7 ulps.
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-6, atol=1e-6)


def test_logprobs_match_torch_log_softmax(tied):
    """Independent of our logits: torch float64 log_softmax of transformers' logits / T."""
    model, cfg, params = tied
    logp = token_logprobs(params, cfg, jnp.asarray(TOKENS), temperature=0.8, chunk_size=16)
    ref_all = torch.log_softmax(torch.tensor(hf_logits(model, TOKENS)[:, :-1]) / 0.8, dim=-1)
    ref = torch.gather(ref_all, -1, torch.tensor(TOKENS[:, 1:, None]))[..., 0].numpy()
    np.testing.assert_allclose(logp, ref, rtol=0, atol=2e-5)


def test_gradients_equal_full_softmax_gradients(untied):
    _, cfg, params = untied
    tokens = jnp.asarray(TOKENS)
    weights = jnp.asarray(np.random.RandomState(2).uniform(-1, 1, (3, 39)), jnp.float32)

    def chunked_loss(p):  # also with per-layer rematerialisation, which must not change gradients
        logp, entropy = token_logprobs(p, cfg, tokens, temperature=0.7, chunk_size=8, return_entropy=True,
                                       remat=True)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(entropy)

    def naive_loss(p):
        logp, entropy = naive_logprobs(forward(p, cfg, tokens)[0], tokens, 0.7)
        return jnp.sum(weights * logp) + 0.1 * jnp.sum(entropy)

    grads, ref_grads = jax.jit(jax.grad(chunked_loss))(params), jax.jit(jax.grad(naive_loss))(params)
    for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(ref_grads)):
        scale = float(jnp.max(jnp.abs(r)))
        assert scale > 0 and float(jnp.max(jnp.abs(g - r))) <= 1e-5 * scale, jax.tree_util.keystr(path)


def _temp_bytes(fn, *args) -> int:
    return jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes


def test_peak_memory_stays_flat_as_sequence_grows():
    """XLA's compiled temp buffers: chunked stays ~flat in T (forward and backward), full softmax grows ~T."""
    cfg = DecoderConfig(vocab_size=8192, hidden_size=32, intermediate_size=32, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
    head = {"embed": jax.ShapeDtypeStruct((8192, 32), jnp.float32)}

    def chunked(p, h, t):
        return jnp.sum(chunked_logprobs_from_hidden(h, t, p, cfg, chunk_size=64))

    def naive(p, h, t):
        logp = jax.nn.log_softmax(lm_head_logits(h, p, cfg), axis=-1)
        return jnp.sum(jnp.take_along_axis(logp, t[..., None], axis=-1))

    sizes = {}
    for length in (256, 1024):
        args = (head, jax.ShapeDtypeStruct((2, length, 32), jnp.float32), jax.ShapeDtypeStruct((2, length), jnp.int32))
        sizes[length] = dict(chunked=_temp_bytes(chunked, *args), chunked_grad=_temp_bytes(jax.grad(chunked), *args),
                             naive=_temp_bytes(naive, *args))
    logits_bytes = 2 * 1024 * 8192 * 4  # one float32 [B, T, V] at T = 1024: 64 MiB
    assert sizes[1024]["naive"] >= logits_bytes and sizes[1024]["naive"] > 3 * sizes[256]["naive"]
    for kind in ("chunked", "chunked_grad"):
        assert sizes[1024][kind] < 1.5 * sizes[256][kind], (kind, sizes)
        assert sizes[1024][kind] < logits_bytes / 4, (kind, sizes)


def test_bad_temperature_and_chunk_size_are_rejected(tied):
    _, cfg, params = tied
    with pytest.raises(ValueError, match=r"temperature=0\.0 must be > 0"):
        token_logprobs(params, cfg, jnp.asarray(TOKENS), temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size=0 must be a positive int"):
        token_logprobs(params, cfg, jnp.asarray(TOKENS), chunk_size=0)
