"""models/matmul.py and the unrolled layer loop: bf16 projections equal the float64 product of the
same bf16 values rounded once, forward and backward; XLA:CPU compiles their dots with bf16 operands
(no float32 copies); "dots" remat keeps them; unrolled layers compute what the loop computes."""
from __future__ import annotations

import contextlib
import io
import re

import jax
from jax.ad_checkpoint import print_saved_residuals
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, decoder, forward, init_params, token_logprobs
from jaxrl_llm.models.decoder import unroll_layer_loop
from jaxrl_llm.models.matmul import low_precision_logits, project

CFG = DecoderConfig.from_hf(dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                 architectures=["LlamaForCausalLM"], model_type="llama"))


def _bf16_operands():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (2, 5, 64)).astype(jnp.bfloat16)
    w = jax.random.normal(keys[1], (64, 48)).astype(jnp.bfloat16)
    g = jax.random.normal(keys[2], (2, 5, 48)).astype(jnp.bfloat16)
    return x, w, g


def _assert_rounded_once(ours, exact):
    """bf16 round-to-nearest of the exact value: within half a bf16 ulp (at most 2^-8 relative), plus
    float32 summation error."""
    assert ours.dtype == jnp.bfloat16
    ours, exact = np.asarray(ours, np.float64), np.asarray(exact, np.float64)
    assert np.all(np.abs(ours - exact) <= 2.0**-8 * np.abs(exact) + 1e-5 * np.max(np.abs(exact)))


def test_bf16_projection_and_its_gradients_are_the_exact_products_rounded_once():
    x, w, g = _bf16_operands()
    x64, w64, g64 = (np.asarray(a, np.float64) for a in (x, w, g))
    y, vjp = jax.vjp(project, x, w)
    dx, dw = vjp(g)
    _assert_rounded_once(y, x64 @ w64)
    _assert_rounded_once(dx, g64 @ w64.T)
    _assert_rounded_once(dw, np.einsum("btd,bto->do", x64, g64))


def _dot_operand_types(hlo: str) -> list[str]:
    """The parameter types of every computation of compiled HLO text that holds a dot."""
    types = []
    for header, body in re.findall(r"^(%\S+ \(.*?\) -> .*?) \{\n(.*?)\n\}", hlo, flags=re.M | re.S):
        if " dot(" in body:
            types += re.findall(r": (\w+)\[", header.split(" -> ")[0])
    return types


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's handling of bf16 dots")
def test_xla_cpu_gets_bf16_operands_forward_and_backward():
    x, w, g = _bf16_operands()

    def loss(x, w, matmul):
        return jnp.sum((matmul(x, w) * g).astype(jnp.float32))

    ours = _dot_operand_types(jax.jit(jax.value_and_grad(lambda x, w: loss(x, w, project), (0, 1)))
                              .lower(x, w).compile().as_text())
    assert len(ours) >= 6 and set(ours) == {"bf16"}  # 3 dots (y, dx, dw), 2 operands each
    plain = _dot_operand_types(jax.jit(jax.value_and_grad(lambda x, w: loss(x, w, jnp.matmul), (0, 1)))
                               .lower(x, w).compile().as_text())
    assert "f32" in plain  # what project avoids: XLA:CPU converts a bf16 -> bf16 dot's operands to float32


def _saved_residuals(cfg, params, remat) -> list[str]:
    tokens = jnp.zeros((3, 5), jnp.int32)

    def hidden_sum(layers):
        hidden, _ = forward({**params, "layers": layers}, cfg, tokens, return_hidden=True, remat=remat)
        return jnp.sum(hidden.astype(jnp.float32))

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(hidden_sum, params["layers"])
    return sorted(line.split(" from")[0] for line in printed.getvalue().splitlines())


def test_dots_remat_keeps_the_bf16_projections(monkeypatch):
    cfg = CFG.with_dtypes("bfloat16", "bfloat16")
    params = init_params(cfg, jax.random.PRNGKey(0))
    ours = _saved_residuals(cfg, params, "dots")
    monkeypatch.setattr(decoder, "project", jnp.matmul)  # plain dots, which the stock policy sees
    assert ours == _saved_residuals(cfg, params, "dots")
    # q, k, v, o, gate, up, down: 7 [nL, B, T, width] outputs
    assert sum(bool(re.match(r"bf16\[3,3,5,\d+\] output of scan", line)) for line in ours) == 7


def test_unroll_layer_loop_policy():
    bf16 = CFG.with_dtypes("bfloat16", "bfloat16")
    assert unroll_layer_loop(bf16, "cpu", "off")
    assert unroll_layer_loop(CFG.with_dtypes("float32", "bfloat16"), "cpu", "off")
    assert not unroll_layer_loop(CFG, "cpu", "off")
    assert not unroll_layer_loop(bf16, "gpu", "off")
    assert not unroll_layer_loop(bf16, "cpu", "dots") and not unroll_layer_loop(bf16, "cpu", "full")


@pytest.mark.parametrize("remat", ["off", pytest.param("dots", marks=pytest.mark.slow)])
def test_unrolled_layers_compute_what_the_loop_computes(monkeypatch, remat):
    params = init_params(CFG, jax.random.PRNGKey(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (2, 7)), jnp.int32)

    def value_and_grads(unroll):
        monkeypatch.setattr(decoder, "unroll_layer_loop", lambda cfg, backend, remat: unroll)
        loss = lambda p: -jnp.mean(token_logprobs(p, CFG, tokens, chunk_size=4, remat=remat))  # noqa: E731
        return jax.jit(jax.value_and_grad(loss))(params)

    (looped, looped_grads), (unrolled, unrolled_grads) = value_and_grads(False), value_and_grads(True)
    np.testing.assert_allclose(unrolled, looped, rtol=1e-6)
    for a, b in zip(jax.tree_util.tree_leaves(unrolled_grads), jax.tree_util.tree_leaves(looped_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bf16_tied_head_logits_are_float32_and_their_gradients_the_exact_products_rounded_once():
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    hidden = jax.random.normal(keys[0], (2, 5, 64)).astype(jnp.bfloat16)
    embed = jax.random.normal(keys[1], (97, 64)).astype(jnp.bfloat16)
    g = jax.random.normal(keys[2], (2, 5, 97))  # float32, as the log-softmax hands it back
    h64, e64 = np.asarray(hidden, np.float64), np.asarray(embed, np.float64)
    g64 = np.asarray(g.astype(jnp.bfloat16), np.float64)  # the backward rounds it to bf16 first
    logits, vjp = jax.vjp(low_precision_logits, hidden, embed)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, h64 @ e64.T, rtol=1e-5, atol=1e-5)
    dhidden, dembed = vjp(g)
    _assert_rounded_once(dhidden, g64 @ e64)
    _assert_rounded_once(dembed, np.einsum("btv,btd->vd", g64, h64))
    grads = jax.jit(jax.grad(lambda h, e: jnp.sum(low_precision_logits(h, e) * g), (0, 1)))
    types = _dot_operand_types(grads.lower(hidden, embed).compile().as_text())
    if jax.default_backend() == "cpu":  # dh and dembed: 2 dots of bf16 operands, no float32 copy of embed
        assert len(types) >= 4 and set(types) == {"bf16"}
