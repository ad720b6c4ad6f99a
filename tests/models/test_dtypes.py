"""Precision policy: bf16/fp16 params or compute run, and logprobs stay float32."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import forward, token_logprobs
from jaxrl_llm.models.hf_names import params_from_hf
from tests.models.hf_reference import hf_model, our_config_and_params

POLICIES = [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "bfloat16")]


@pytest.fixture(scope="module")
def runs():
    """float32 reference logprobs, and (params, logp, entropy, logits, hidden) per policy."""
    model = hf_model("qwen2_qkv_bias")
    cfg32, params32 = our_config_and_params(model)
    state = {name: tensor.numpy() for name, tensor in model.state_dict().items()}
    tokens = jnp.asarray(np.random.RandomState(6).randint(0, 97, size=(2, 24)))

    def run(cfg, params):
        logp, entropy = token_logprobs(params, cfg, tokens, chunk_size=8, return_entropy=True)
        logits, _ = forward(params, cfg, tokens)
        return logp, entropy, logits, forward(params, cfg, tokens, return_hidden=True)[0]

    reference = jax.jit(lambda p: run(cfg32, p))(params32)[0]
    out = {}
    for param_dtype, compute_dtype in POLICIES:
        cfg = cfg32.with_dtypes(param_dtype, compute_dtype)
        params = jax.tree_util.tree_map(jnp.asarray, params_from_hf(state, cfg, dtype=jnp.dtype(param_dtype)))
        out[param_dtype, compute_dtype] = (cfg, params, *jax.jit(lambda p, cfg=cfg: run(cfg, p))(params))
    return np.asarray(reference), tokens, out


# Mantissa bits: bf16 7, fp16 10. Measured max errors here: ~0.07 (bf16), ~0.007 (fp16).
@pytest.mark.parametrize("policy, atol", [(POLICIES[0], 0.15), (POLICIES[1], 0.02), (POLICIES[2], 0.15)])
def test_low_precision_policies_give_float32_logprobs(runs, policy, atol):
    reference, _, out = runs
    cfg, params, logp, entropy, logits, hidden = out[policy]
    assert {x.dtype for x in jax.tree_util.tree_leaves(params)} == {jnp.dtype(policy[0])}
    assert logp.dtype == entropy.dtype == logits.dtype == jnp.float32
    assert hidden.dtype == jnp.dtype(policy[1])
    assert np.all(np.isfinite(logp)) and np.all(np.isfinite(entropy))
    error = np.max(np.abs(np.asarray(logp) - reference))
    assert 0 < error <= atol  # really computed in low precision, yet close to float32


def test_fp16_error_is_smaller_than_bf16(runs):
    """FP16's 3 extra mantissa bits (Qi et al. 2025, arXiv 2510.26788) show as a smaller logprob error."""
    reference, _, out = runs
    error = {policy: np.mean(np.abs(np.asarray(out[policy][2]) - reference)) for policy in POLICIES[:2]}
    assert error[POLICIES[1]] < error[POLICIES[0]] / 2, error


def test_gradients_of_float32_master_params_under_bf16_compute_are_float32(runs):
    _, tokens, out = runs
    cfg, params = out[POLICIES[2]][:2]
    grads = jax.jit(jax.grad(lambda p: jnp.sum(token_logprobs(p, cfg, tokens, chunk_size=8))))(params)
    leaves = jax.tree_util.tree_leaves(grads)
    assert {g.dtype for g in leaves} == {jnp.dtype(jnp.float32)}
    assert all(np.all(np.isfinite(g)) for g in leaves) and any(np.any(g != 0) for g in leaves)
