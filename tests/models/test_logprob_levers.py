"""The fused LM head's levers (`models.logprobs.HeadOptions`: chunk size, the logits' output dtype,
the matmul's operand dtype) against an unchunked float32 log-softmax written here with plain jnp.

Bounds: float32 everywhere, the chunked sums differ from the reference's only in summation order:
a few ulps of logits of size ~3 here, well under 1e-5. bf16 logits: rounding each float32 logit
to nearest bf16 moves it by at most u |z_v| (u = 2^-8), and logsumexp is 1-Lipschitz in the max
norm, so |delta log p| <= |delta z_y| + max_v |delta z_v| <= 2 u max_v |z_v|.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden
from jaxrl_llm.models.logprobs import HeadOptions, head_options

VOCAB, WIDTH, ROWS, LENGTH = 512, 64, 2, 37
BF16_UNIT_ROUNDOFF = 2.0 ** -8


def config(dtype: str) -> DecoderConfig:
    return DecoderConfig(vocab_size=VOCAB, hidden_size=WIDTH, intermediate_size=128, num_layers=1, num_heads=4,
                         num_kv_heads=2, head_dim=16, tie_word_embeddings=True, param_dtype=dtype,
                         compute_dtype=dtype)


def inputs():
    keys = jax.random.split(jax.random.key(0), 3)
    hidden = jax.random.normal(keys[0], (ROWS, LENGTH, WIDTH), jnp.float32)
    embed = jax.random.normal(keys[1], (VOCAB, WIDTH), jnp.float32) * 0.4  # logits of size ~3
    targets = jax.random.randint(keys[2], (ROWS, LENGTH), 0, VOCAB)
    return hidden, embed, targets


def reference(hidden, embed, targets):
    """float32, unchunked: log softmax(h E^T)[y], written out."""
    logits = jnp.einsum("bnd,vd->bnv", hidden.astype(jnp.float32), embed.astype(jnp.float32),
                        precision=jax.lax.Precision.HIGHEST)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - jnp.log(jnp.exp(shifted).sum(-1, keepdims=True))
    return jnp.take_along_axis(log_probs, targets[..., None], -1)[..., 0], logits


def head(hidden, embed, targets, cfg, options):
    return chunked_logprobs_from_hidden(hidden, targets, {"embed": embed}, cfg, options=options)


@pytest.mark.parametrize("chunk", [1, 7, 16, 128, 4096])
def test_every_chunk_size_gives_the_float32_logprobs_and_gradients(chunk):
    hidden, embed, targets = inputs()
    cfg, options = config("float32"), HeadOptions(chunk_size=chunk)
    expected, _ = reference(hidden, embed, targets)
    np.testing.assert_allclose(head(hidden, embed, targets, cfg, options), expected, atol=1e-5, rtol=0)
    weights = jax.random.normal(jax.random.key(5), targets.shape)
    grad_ref = jax.grad(lambda h, e: jnp.sum(reference(h, e, targets)[0] * weights), (0, 1))(hidden, embed)
    grad = jax.grad(lambda h, e: jnp.sum(head(h, e, targets, cfg, options) * weights), (0, 1))(hidden, embed)
    for got, want in zip(grad, grad_ref):
        np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_bf16_logits_stay_within_the_rounding_bound_and_differ_from_float32_logits():
    hidden, embed, targets = inputs()
    h16, e16 = hidden.astype(jnp.bfloat16), embed.astype(jnp.bfloat16)
    expected, logits = reference(h16, e16, targets)  # the same bf16 operands, exact float32 products
    bound = 2 * BF16_UNIT_ROUNDOFF * float(jnp.abs(logits).max()) + 1e-5
    cfg = config("bfloat16")
    rounded = head(h16, e16, targets, cfg, HeadOptions(chunk_size=16, logits_dtype="compute"))
    error = float(jnp.abs(rounded - expected).max())
    assert 0 < error <= bound, (error, bound)
    exact = head(h16, e16, targets, cfg, HeadOptions(chunk_size=16))  # float32 logits: only summation order
    assert float(jnp.abs(exact - expected).max()) < 1e-5 < error
    # the backward recomputes the same rounded logits: its gradient matches autodiff through the rounding
    weights = jax.random.normal(jax.random.key(5), targets.shape)

    def rounded_reference(h):
        z = jnp.einsum("bnd,vd->bnv", h, e16, preferred_element_type=jnp.float32).astype(jnp.bfloat16)
        return jnp.sum(jnp.take_along_axis(jax.nn.log_softmax(z.astype(jnp.float32)), targets[..., None], -1)[..., 0]
                       * weights)

    options = HeadOptions(chunk_size=16, logits_dtype="compute")
    got = jax.grad(lambda h: jnp.sum(head(h, e16, targets, cfg, options) * weights))(h16)
    want = jax.grad(rounded_reference)(h16)
    np.testing.assert_allclose(got.astype(jnp.float32), want.astype(jnp.float32), atol=2e-2, rtol=2e-2)


def test_float32_matmul_in_a_bf16_model_matches_the_unrounded_reference():
    hidden, embed, targets = inputs()
    e16 = embed.astype(jnp.bfloat16)
    expected, _ = reference(hidden, e16, targets)  # hidden not rounded to bf16
    cfg = config("bfloat16")
    full = head(hidden, e16, targets, cfg, HeadOptions(chunk_size=16, matmul_dtype="float32"))
    default = head(hidden, e16, targets, cfg, HeadOptions(chunk_size=16))  # hidden rounded to bf16 first
    assert float(jnp.abs(full - expected).max()) < 1e-5 < float(jnp.abs(default - expected).max())


def test_options_from_the_environment_and_bad_values():
    assert head_options({}) == HeadOptions()
    assert head_options({"JAXRL_LLM_HEAD_CHUNK": "1024", "JAXRL_LLM_HEAD_LOGITS": "compute",
                         "JAXRL_LLM_HEAD_MATMUL": "float32"}) == HeadOptions(1024, "compute", "float32")
    with pytest.raises(ValueError, match="JAXRL_LLM_HEAD_CHUNK='-3' must be a positive integer"):
        head_options({"JAXRL_LLM_HEAD_CHUNK": "-3"})
    with pytest.raises(ValueError, match="logits_dtype='bf16' is invalid; valid: float32, compute"):
        head_options({"JAXRL_LLM_HEAD_LOGITS": "bf16"})
    hidden, embed, targets = inputs()
    with pytest.raises(ValueError, match="chunk_size=0 must be a positive int"):
        head(hidden, embed, targets, config("float32"), HeadOptions(chunk_size=0))
    with pytest.raises(ValueError, match="need fused=True"):
        chunked_logprobs_from_hidden(hidden, targets, {"embed": embed}, config("float32"), fused=False,
                                     options=HeadOptions(logits_dtype="compute"))
