"""Layers unrolled (forward(..., unroll_layers=True)) against the scanned loop and transformers."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import forward, token_logprobs
from tests.models.hf_reference import hf_logits, hf_model, our_config_and_params, rel_err

TOKENS = np.random.default_rng(3).integers(0, 96, (2, 24)).astype(np.int32)
MASK = (np.arange(24)[None, :] < np.array([[24], [15]])).astype(np.int32)


def test_unrolled_layers_match_the_scan_and_transformers():
    model = hf_model("qwen3_qk_norm", num_hidden_layers=3)  # q/k norms, untied head, 3 distinct layers
    cfg, params = our_config_and_params(model)
    tokens, mask = jnp.asarray(TOKENS), jnp.asarray(MASK)

    def loss(params, unroll):
        logp = token_logprobs(params, cfg, tokens, attention_mask=mask, unroll_layers=unroll)
        return -jnp.sum(logp * mask[:, 1:])

    grad = {unroll: jax.jit(jax.value_and_grad(loss), static_argnums=1) for unroll in (False, True)}
    (loss_scan, grads_scan), (loss_unrolled, grads_unrolled) = grad[False](params, False), grad[True](params, True)
    np.testing.assert_allclose(float(loss_unrolled), float(loss_scan), rtol=1e-6)
    for path, got in jax.tree_util.tree_leaves_with_path(grads_unrolled):
        want = np.asarray(jax.tree_util.tree_leaves(grads_scan)[
            [p for p, _ in jax.tree_util.tree_leaves_with_path(grads_scan)].index(path)])
        assert float(np.abs(want).max()) > 0, path  # every weight gets a gradient
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()),
                                   err_msg=jax.tree_util.keystr(path))
    logits, _ = jax.jit(lambda p: forward(p, cfg, tokens, attention_mask=mask, unroll_layers=True))(params)
    valid = MASK.astype(bool)
    assert rel_err(np.asarray(logits)[valid], hf_logits(model, TOKENS, attention_mask=MASK)[valid]) <= 1e-5


def test_unrolled_program_has_no_layer_loop():
    model = hf_model("llama_tied", num_hidden_layers=3)
    cfg, params = our_config_and_params(model)

    def hlo(unroll):
        fn = jax.jit(lambda p, t: forward(p, cfg, t, unroll_layers=unroll)[0])
        return fn.lower(params, jnp.asarray(TOKENS)).as_text()

    assert "while" in hlo(False) and "while" not in hlo(True)
