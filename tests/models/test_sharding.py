"""Sharded over 8 fake CPU devices (fsdp x tensor) == one device; mesh and rule checks."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import (DecoderConfig, batch_sharding, forward, make_mesh, param_partition_specs,
                              param_shapes, param_shardings, token_logprobs)
from tests.models.hf_reference import SMOLLM2_CONFIG, hf_model, our_config_and_params, rel_err

if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices; tests/conftest.py sets them up", allow_module_level=True)


@pytest.fixture(scope="module")
def qwen3():
    # vocab 128 and heads divisible by 2 and 4, so every rule really splits its dimension.
    return our_config_and_params(hf_model("qwen3_qk_norm", vocab_size=128))


@pytest.mark.parametrize("fsdp, tensor", [(2, 4), (4, 2)])
def test_sharded_logits_and_logprobs_equal_single_device(qwen3, fsdp, tensor):
    cfg, params = qwen3
    tokens = jnp.asarray(np.random.RandomState(5).randint(0, 128, size=(4, 24)))

    def run(p, t):
        logits, _ = forward(p, cfg, t)
        return logits, token_logprobs(p, cfg, t, chunk_size=8, temperature=0.9)

    ref_logits, ref_logp = jax.jit(run)(params, tokens)
    mesh = make_mesh(1, fsdp, tensor)
    sharded_params = jax.device_put(params, param_shardings(params, mesh))
    sharded_tokens = jax.device_put(tokens, batch_sharding(mesh))
    q_proj = sharded_params["layers"]["q_proj"]
    assert q_proj.sharding.spec == P(None, "fsdp", "tensor")
    assert q_proj.addressable_shards[0].data.shape == (2, 32 // fsdp, 64 // tensor)
    logits, logp = jax.jit(run)(sharded_params, sharded_tokens)
    assert len(logits.sharding.device_set) == 8
    assert rel_err(logits, ref_logits) <= 1e-5
    np.testing.assert_allclose(logp, ref_logp, rtol=1e-5, atol=1e-5)


def test_smollm2_partition_specs():
    specs = param_partition_specs(param_shapes(DecoderConfig.from_hf(SMOLLM2_CONFIG)), make_mesh(1, 2, 4))
    assert specs["embed"] == P("tensor", "fsdp")
    assert specs["layers"]["k_proj"] == P(None, "fsdp", "tensor")      # [30, 576, 192]
    assert specs["layers"]["down_proj"] == P(None, "tensor", "fsdp")   # [30, 1536, 576]
    assert specs["layers"]["input_norm"] == P(None, None) and specs["final_norm"] == P(None)


def test_indivisible_dimension_is_replicated():
    cfg = DecoderConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=4,
                        num_kv_heads=2, head_dim=8)
    specs = param_partition_specs(param_shapes(cfg), make_mesh(1, 2, 4))
    assert specs["embed"] == P(None, "fsdp") and specs["lm_head"] == P("fsdp", None)


def test_make_mesh_validates_against_device_count():
    mesh = make_mesh(2, -1, 2)
    assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
    with pytest.raises(ValueError, match=r"data=2 x fsdp=2 x tensor=4 = 16 devices, but 8 are available"):
        make_mesh(2, 2, 4)
    with pytest.raises(ValueError, match=r"mesh axis tensor=0"):
        make_mesh(8, 1, 0)
    with pytest.raises(ValueError, match="only one mesh axis may be -1"):
        make_mesh(-1, -1, 2)


def test_unknown_parameter_name_is_rejected():
    with pytest.raises(ValueError, match=r"no sharding rule for parameter \['adapter'\]"):
        param_partition_specs({"adapter": jnp.zeros((2, 2))}, make_mesh(1, 8, 1))
