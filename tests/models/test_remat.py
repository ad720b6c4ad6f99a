"""Remat modes (models/remat.py): the same loss and gradients as keeping every activation, and
the residuals each mode keeps, counted by hand from the layer's matmuls."""
from __future__ import annotations

import contextlib
import functools
import io
import re

import jax
from jax.ad_checkpoint import print_saved_residuals
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, forward, init_params, token_logprobs
from jaxrl_llm.models.remat import REMAT_MODES, remat_mode
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides

CFG = DecoderConfig.from_hf(dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                 architectures=["LlamaForCausalLM"], model_type="llama"))
BATCH, LENGTH = 3, 5  # distinct from every width above, so a residual's shape says what it is


@functools.lru_cache(maxsize=1)
def _params_and_tokens():
    params = init_params(CFG, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, CFG.vocab_size, (BATCH, LENGTH)), jnp.int32)
    return params, tokens


def _loss(params, tokens, remat):
    return -jnp.mean(token_logprobs(params, CFG, tokens, chunk_size=2, remat=remat))


def _layer_floats_per_token(remat) -> int:
    """Floats per (layer, token) the layer scan keeps for the backward pass: the sum of the last dims
    of the saved residuals shaped [nL, B, T, ...], read from jax.ad_checkpoint.print_saved_residuals."""
    params, tokens = _params_and_tokens()

    def hidden_sum(layers):
        hidden, _ = forward({**params, "layers": layers}, CFG, tokens, return_hidden=True, remat=remat)
        return jnp.sum(hidden)

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        print_saved_residuals(hidden_sum, params["layers"])
    prefix = f"{CFG.num_layers},{BATCH},{LENGTH},"
    shapes = re.findall(r"^f32\[([\d,]+)\]", printed.getvalue(), flags=re.M)
    return sum(int(np.prod([int(d) for d in s[len(prefix):].split(",")])) for s in shapes if s.startswith(prefix))


@pytest.mark.slow  # ~8 CPU-s: compiles forward+backward three times
def test_remat_leaves_loss_and_grads_unchanged():
    params, tokens = _params_and_tokens()
    value_and_grads = jax.jit(lambda p, t: {m: jax.value_and_grad(_loss)(p, t, m) for m in REMAT_MODES})
    results = value_and_grads(params, tokens)
    ref_loss, ref_grads = results["off"]
    for mode in ("dots", "full"):
        loss, grads = results[mode]
        assert float(loss) == pytest.approx(float(ref_loss), rel=1e-6), mode
        for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(ref_grads)):
            scale = float(jnp.max(jnp.abs(r)))
            assert scale > 0 and float(jnp.max(jnp.abs(g - r))) <= 1e-5 * scale, (mode, jax.tree_util.keystr(path))


def test_each_mode_keeps_what_it_names():
    d, q, kv, f = CFG.hidden_size, CFG.q_dim, CFG.kv_dim, CFG.intermediate_size
    # "full": the layer's input only. "dots": the input and the matmul outputs the backward pass
    # reads (q, k, v, o_proj's, gate, up; down_proj's output only enters a sum, whose gradient needs nothing).
    assert _layer_floats_per_token("full") == d
    assert _layer_floats_per_token("dots") == d + q + 2 * kv + d + 2 * f
    assert _layer_floats_per_token("off") > d + q + 2 * kv + d + 2 * f  # + norms, rotary, SiLU, attention


def test_bad_remat_names_fail_naming_the_valid_ones():
    assert [remat_mode(m) for m in (*REMAT_MODES, True, False)] == [*REMAT_MODES, "full", "off"]
    with pytest.raises(ValueError, match=r"remat='dot' is invalid; valid: one of 'off', 'dots', 'full'"):
        remat_mode("dot")
    params, tokens = _params_and_tokens()
    with pytest.raises(ValueError, match="remat='everything' is invalid"):
        forward(params, CFG, tokens, remat="everything")
    with pytest.raises(ConfigError, match=r"train.remat = 'dot' .*valid: one of 'off', 'dots', 'full', 'auto'; did you mean 'dots'"):
        apply_overrides(Config(), ["train.remat=dot"])
    assert apply_overrides(Config(), ["train.remat=dots"]).train.remat == "dots"
