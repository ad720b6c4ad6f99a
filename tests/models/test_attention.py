"""The decoder's attention (jax.nn.dot_product_attention) against the explicit formulation it
replaced: materialised [B, Hkv, G, T, S] scores, masked with float32's lowest value, softmax; and
the learner's causal attention in query blocks against one call over all keys."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, attention, decoder, forward, init_params
from jaxrl_llm.models.attention import attention_block_size, causal_attention, grouped_attention
from jaxrl_llm.models.fused_attention import use_cudnn_attention, with_own_key


def explicit_attention(q, k, v, visible):
    """The previous implementation, kept here as the reference."""
    batch, length, num_heads, head_dim = q.shape
    num_kv = k.shape[2]
    q = q.reshape(batch, length, num_kv, num_heads // num_kv, head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, k, preferred_element_type=jnp.float32) * head_dim ** -0.5
    scores = jnp.where(visible[:, None, None], scores, np.finfo(np.float32).min)
    weights = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bkgts,bskd->btkgd", weights, v).reshape(batch, length, num_heads, head_dim)


def masks(batch, length, keys):
    """Causal + left padding + two packed segments, queries at the last `length` of `keys` slots
    (as in a KV cache); row 0 is unpadded, the others start 1 .. keys // 2 slots late."""
    slots = np.arange(keys)
    causal = slots[None, :] <= (keys - length + np.arange(length))[:, None]
    start = np.linspace(0, keys // 2, batch).astype(int)[:, None]
    real = slots[None, :] >= start
    segment = np.where(slots[None, :] < (start + keys) // 2, 1, 2) * real
    same = segment[:, keys - length:, None] == segment[:, None, :]
    return jnp.asarray(causal[None] & same & real[:, None, :])


def _operands(length, keys, dtype, seed):
    """q [3, length, 6, 8], k/v [3, keys, 2, 8] in dtype, and a float32 cotangent shaped like q."""
    kq, kk, kv, kg = jax.random.split(jax.random.key(seed), 4)
    return (jax.random.normal(kq, (3, length, 6, 8), dtype), jax.random.normal(kk, (3, keys, 2, 8), dtype),
            jax.random.normal(kv, (3, keys, 2, 8), dtype), jax.random.normal(kg, (3, length, 6, 8), jnp.float32))


def _assert_same_attention(ours, reference, q, k, v, cotangent, visible, tol):
    """Same dtype, same values at every row with a visible key (the others are padding, value
    irrelevant), same gradients of a loss that reads only those rows; returns ours' output."""
    has_key = np.asarray(visible.any(-1))

    def grads(fn):
        return jax.jit(jax.grad(lambda q, k, v: jnp.sum(jnp.where(has_key[..., None, None], fn(q, k, v, visible), 0)
                                                          * cotangent), argnums=(0, 1, 2)))(q, k, v)

    got, want = jax.jit(ours)(q, k, v, visible), jax.jit(reference)(q, k, v, visible)
    assert got.dtype == want.dtype == q.dtype
    np.testing.assert_allclose(np.asarray(got, np.float32)[has_key], np.asarray(want, np.float32)[has_key],
                               atol=tol, rtol=tol)
    for a, b in zip(grads(ours), grads(reference)):
        np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), atol=5 * tol, rtol=5 * tol)
    return got


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 1e-2), ("float16", 2e-3)])
@pytest.mark.parametrize("length, keys", [(12, 12), (1, 12)])  # training / prefill, one decode step
def test_attention_matches_the_explicit_formulation(dtype, tol, length, keys):
    q, k, v, cotangent = _operands(length, keys, dtype, seed=0)
    visible = masks(3, length, keys)
    assert np.asarray(visible.any(-1)).mean() > 0.5 and 1 < visible.sum(-1).max() < keys  # the masks cut something
    new = _assert_same_attention(grouped_attention, explicit_attention, q, k, v, cotangent, visible, tol)
    assert np.all(np.isfinite(np.asarray(new, np.float32)))


def test_attention_block_size_rule():
    # at most 8 blocks of at least 128 rows, by hand
    lengths = (1, 128, 300, 1024, 1025, 2048, 4096)
    assert [attention_block_size(t) for t in lengths] == [128, 128, 128, 128, 129, 256, 512]


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 1e-2)])
def test_causal_block_attention_matches_one_call(dtype, tol):
    """300 rows: query blocks of 128, 128 and 44 rows over key prefixes of 128, 256 and 300, against one
    call over all keys; causal + packed segments + left padding (masks(), keys = rows)."""
    length = 300
    q, k, v, cotangent = _operands(length, length, dtype, seed=1)
    visible = masks(3, length, length)
    assert 0.5 < np.asarray(visible.any(-1)).mean() < 1  # padded rows exist, the only ones allowed to differ
    _assert_same_attention(causal_attention, grouped_attention, q, k, v, cotangent, visible, tol)


def test_decoder_forward_uses_block_attention_without_changing_logits(monkeypatch):
    """A tiny decoder at 260 tokens (3 blocks): the learner's forward, and the same forward with one
    attention call per layer, give the same logits at every real token (right padding in row 1)."""
    cfg = DecoderConfig.from_hf(dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                     architectures=["LlamaForCausalLM"], model_type="llama"))
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, cfg.vocab_size, (2, 260)), jnp.int32)
    mask = jnp.asarray(np.arange(260)[None] < np.array([[260], [200]]), jnp.int32)
    calls = []

    def counted(q, k, v, visible):
        calls.append(q.shape[1])
        return grouped_attention(q, k, v, visible)

    monkeypatch.setattr(attention, "grouped_attention", counted)  # what causal_attention calls
    blocked, _ = forward(params, cfg, tokens, attention_mask=mask)
    assert calls[:3] == [128, 128, 4] and len(calls) % 3 == 0  # blocks of the layer body (nn.scan may trace it twice)
    monkeypatch.setattr(decoder, "causal_attention", counted)
    whole, _ = forward(params, cfg, tokens, attention_mask=mask)
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(np.asarray(blocked)[real], np.asarray(whole)[real], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype, tol", [("float32", 1e-6), ("bfloat16", 1e-2)])
def test_own_key_leaves_every_row_with_a_visible_key_as_it_was(dtype, tol):
    """The cuDNN path lets each query see its own key (models.fused_attention.with_own_key): only
    rows that saw no key (padding) change, and afterwards every row sees one."""
    q, k, v, cotangent = _operands(40, 40, dtype, seed=2)
    visible = masks(3, 40, 40)
    own = with_own_key(visible)
    assert not np.asarray(visible.any(-1)).all()  # padding rows exist
    assert np.asarray(own.any(-1)).all()
    assert int((own & ~visible).sum()) == int((~np.asarray(visible.any(-1))).sum())  # one key per padding row
    _assert_same_attention(lambda q, k, v, vis: grouped_attention(q, k, v, with_own_key(vis)), grouped_attention,
                           q, k, v, cotangent, visible, tol)


def test_cudnn_attention_only_where_the_kernel_applies():
    assert use_cudnn_attention("bfloat16", 64, backend="gpu", environ={})
    assert use_cudnn_attention("float16", 128, backend="gpu", environ={})
    assert not use_cudnn_attention("float32", 64, backend="gpu", environ={})  # cuDNN: bf16/fp16 only
    assert not use_cudnn_attention("bfloat16", 256, backend="gpu", environ={})  # head size <= 128
    assert not use_cudnn_attention("bfloat16", 60, backend="gpu", environ={})  # multiple of 8
    assert not use_cudnn_attention("bfloat16", 64, backend="cpu", environ={})
    assert not use_cudnn_attention("bfloat16", 64, backend="tpu", environ={})
    assert not use_cudnn_attention("bfloat16", 64, backend="gpu", environ={"JAXRL_LLM_CUDNN_ATTENTION": "0"})


def test_segment_spans_by_hand():
    """Rows [1 1 1 2 2 0], [1 2 3 3 0 0] and [1 1 1 1 1 1] (0 = padding): lengths and start offsets
    of segments 1..4 as cuDNN's ragged layout takes them, the padding run as one more segment after
    the row's own (-1 where a row has fewer)."""
    from jaxrl_llm.models.fused_attention import segment_spans

    segments = jnp.array([[1, 1, 1, 2, 2, 0], [1, 2, 3, 3, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
    visible = jnp.ones((3, 6, 6), bool)
    spans = segment_spans(segments, visible, 4)
    np.testing.assert_array_equal(spans.lengths, [[3, 2, 1, -1, -1], [1, 1, 2, 2, -1], [6, -1, -1, -1, -1]])
    np.testing.assert_array_equal(spans.offsets, [[0, 3, 5, -1, -1, -1], [0, 1, 2, 4, -1, -1],
                                                  [0, -1, -1, -1, -1, -1]])
    np.testing.assert_array_equal(spans.real, segments > 0)


def test_segment_spans_leave_the_cpu_path_as_it_was():
    """On XLA (CPU), a forward given max_segments computes exactly what the mask path does."""
    cfg = DecoderConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, max_position_embeddings=32, param_dtype="bfloat16",
                        compute_dtype="bfloat16")
    params = init_params(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 1, 61)
    segments = jnp.array([[1] * 5 + [2] * 6 + [0], [1] * 12], jnp.int32)
    plain, _ = forward(params, cfg, tokens, segment_ids=segments)
    spans, _ = forward(params, cfg, tokens, segment_ids=segments, max_segments=2)
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(spans))
