"""fused_chunked_logprobs: its hand-written VJP equals autodiff of the unchunked log-softmax, and keeps the
chunked path's memory."""
import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, logprobs_from_logits
from jaxrl_llm.models.logprobs import fused_chunked_logprobs

B, N, D, V, CHUNK = 2, 13, 16, 37, 4  # 13 = 3 chunks of 4 and one of 1 (padded)


def _inputs(tied, dtype=jnp.float32, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), 5)
    hidden = jax.random.normal(keys[0], (B, N, D)).astype(dtype)
    weight = (0.4 * jax.random.normal(keys[1], (V, D) if tied else (D, V))).astype(dtype)
    targets = jax.random.randint(keys[2], (B, N), 0, V)
    a, b = jax.random.normal(keys[3], (B, N)), jax.random.normal(keys[4], (B, N))
    return hidden, weight, targets, a, b


def _reference(hidden, targets, weight, *, tied, temperature, return_entropy):
    """The unchunked formulation: all [B, N, V] logits, float32."""
    hidden, weight = hidden.astype(jnp.float32), weight.astype(jnp.float32)
    logits = hidden @ (weight.T if tied else weight)
    return logprobs_from_logits(logits, targets, temperature=temperature, return_entropy=return_entropy)


def _loss(fn, targets, a, b, *, return_entropy, **kw):
    """A random-weighted sum of logp (and entropy), as a function of (hidden, weight, temperature)."""
    def loss(hidden, weight, temperature):
        out = fn(hidden, targets, weight, temperature=temperature, return_entropy=return_entropy, **kw)
        if return_entropy:
            return jnp.sum(a * out[0]) + jnp.sum(b * out[1])
        return jnp.sum(a * out)
    return loss


def _assert_close(actual, expected, rtol):
    """Elementwise, relative to the largest reference entry (gradient entries near 0 have no relative scale)."""
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol,
                               atol=rtol * float(np.max(np.abs(expected))))


@pytest.mark.parametrize("return_entropy", [True, False])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tied", [True, False])
def test_values_and_gradients_equal_the_unchunked_softmax(tied, temperature, return_entropy):
    hidden, weight, targets, a, b = _inputs(tied)
    kw = dict(tied=tied, return_entropy=return_entropy)
    out = fused_chunked_logprobs(hidden, targets, weight, temperature=temperature, chunk_size=CHUNK, **kw)
    ref = _reference(hidden, targets, weight, temperature=temperature, **kw)
    for x, r in zip(jax.tree_util.tree_leaves(out), jax.tree_util.tree_leaves(ref)):
        assert x.shape == (B, N) and x.dtype == jnp.float32
        np.testing.assert_allclose(x, r, rtol=1e-5, atol=1e-6)
    fused = _loss(fused_chunked_logprobs, targets, a, b, chunk_size=CHUNK, **kw)
    naive = _loss(_reference, targets, a, b, **kw)
    grads = jax.jit(jax.grad(fused, (0, 1, 2)))(hidden, weight, temperature)
    ref_grads = jax.jit(jax.grad(naive, (0, 1, 2)))(hidden, weight, temperature)
    for name, g, r in zip(("hidden", "weight", "temperature"), grads, ref_grads):
        assert g.shape == r.shape and g.dtype == r.dtype, name
        assert float(jnp.max(jnp.abs(r))) > 0, name
        _assert_close(g, r, rtol=1e-5)


def test_bf16_operands_are_close_to_float32():
    """bf16 hidden and embed: float32 logits and softmax; gradients in bf16 from bf16 products summed in float32."""
    hidden, weight, targets, a, b = _inputs(True, jnp.bfloat16, seed=3)
    kw = dict(tied=True, return_entropy=True)
    logp, entropy = fused_chunked_logprobs(hidden, targets, weight, temperature=0.7, chunk_size=CHUNK, **kw)
    ref_logp, ref_entropy = _reference(hidden, targets, weight, temperature=0.7, **kw)  # same bf16 values, float32
    assert logp.dtype == entropy.dtype == jnp.float32
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)  # operands exact, sums float32
    np.testing.assert_allclose(entropy, ref_entropy, rtol=1e-5, atol=1e-5)
    grads = jax.grad(_loss(fused_chunked_logprobs, targets, a, b, chunk_size=CHUNK, **kw), (0, 1))(hidden, weight, 0.7)
    ref = jax.grad(_loss(_reference, targets, a, b, **kw), (0, 1))(hidden.astype(jnp.float32),
                                                                     weight.astype(jnp.float32), 0.7)
    for g, r in zip(grads, ref):
        assert g.dtype == jnp.bfloat16
        _assert_close(g, r, rtol=2e-2)  # the logit cotangent is rounded to bf16 once, then the result


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_logprobs_from_hidden_fused_equals_checkpointed(tied):
    """The two paths of chunked_logprobs_from_hidden, fused (default) and fused=False, under float32 params
    and bf16 compute: equal values and parameter gradients."""
    cfg = DecoderConfig(vocab_size=V, hidden_size=D, intermediate_size=D, num_layers=1, num_heads=2, num_kv_heads=1,
                        head_dim=8, tie_word_embeddings=tied).with_dtypes("float32", "bfloat16")
    hidden, weight, targets, a, b = _inputs(tied, seed=5)
    embed = weight if tied else jax.random.normal(jax.random.PRNGKey(9), (V, D))
    params = {"embed": embed} if tied else {"embed": embed, "lm_head": weight}

    def loss(p, h, fused):
        logp, entropy = chunked_logprobs_from_hidden(h, targets, p, cfg, temperature=0.7, chunk_size=CHUNK,
                                                     return_entropy=True, fused=fused)
        return jnp.sum(a * logp) + jnp.sum(b * entropy), (logp, entropy)

    (_, out), grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True), static_argnums=2)(params, hidden, True)
    (_, ref), ref_grads = jax.jit(jax.value_and_grad(loss, (0, 1), has_aux=True), static_argnums=2)(params, hidden,
                                                                                                      False)
    for x, r in zip(out, ref):
        np.testing.assert_allclose(x, r, rtol=1e-5, atol=1e-5)
    for g, r in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(ref_grads)):
        assert g.dtype == r.dtype == jnp.float32
        _assert_close(g, r, rtol=1e-2)  # both round the logit cotangent to bf16, not in the same places


def _count_dots(jaxpr) -> int:
    count = 0
    for eqn in jaxpr.eqns:
        count += eqn.primitive.name == "dot_general"
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            count += _count_dots(sub)
    return count


def test_one_matmul_forward_three_backward():
    hidden, weight, targets, a, b = _inputs(False)
    loss = _loss(fused_chunked_logprobs, targets, a, b, chunk_size=CHUNK, tied=False, return_entropy=True)
    assert _count_dots(jax.make_jaxpr(loss)(hidden, weight, 0.7).jaxpr) == 1
    assert _count_dots(jax.make_jaxpr(jax.grad(loss, (0, 1)))(hidden, weight, 0.7).jaxpr) == 4


@pytest.mark.parametrize("return_entropy", [True, False])
def test_backward_holds_no_full_logits(return_entropy):
    """Compiled temp buffers of the gradient: a fraction of one float32 [B, N, V], and no more than the
    checkpointed path's but for the saved per-token logsumexp and entropy."""
    batch, length, width, vocab = 2, 512, 32, 4096
    cfg = DecoderConfig(vocab_size=vocab, hidden_size=width, intermediate_size=width, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
    args = ({"embed": jax.ShapeDtypeStruct((vocab, width), jnp.float32)},
            jax.ShapeDtypeStruct((batch, length, width), jnp.float32), jax.ShapeDtypeStruct((batch, length), jnp.int32))

    def temp_bytes(fused):
        def loss(p, h, t):
            out = chunked_logprobs_from_hidden(h, t, p, cfg, chunk_size=64, return_entropy=return_entropy, fused=fused)
            return sum(jnp.sum(x) for x in jax.tree_util.tree_leaves(out))
        return jax.jit(jax.grad(loss, (0, 1))).lower(*args).compile().memory_analysis().temp_size_in_bytes

    logits_bytes = batch * length * vocab * 4  # 16 MiB; one chunk's logits: 2 MiB
    fused, checkpointed = temp_bytes(True), temp_bytes(False)
    assert fused < logits_bytes / 3, (fused, logits_bytes)
    assert fused <= checkpointed + 2 * batch * length * 4, (fused, checkpointed)


def test_bad_temperature_and_chunk_size_are_rejected():
    hidden, weight, targets, _, _ = _inputs(True)
    with pytest.raises(ValueError, match=r"temperature=0\.0 must be > 0"):
        fused_chunked_logprobs(hidden, targets, weight, tied=True, temperature=0.0)
    with pytest.raises(ValueError, match="chunk_size=0 must be a positive int"):
        fused_chunked_logprobs(hidden, targets, weight, tied=True, chunk_size=0)
