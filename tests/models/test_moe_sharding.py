"""Experts on the mesh: an 8-device CPU mesh (experts over "fsdp", expert width over "tensor")
gives the loss and gradients of one device, with and without routing replay."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import batch_sharding, forward, load_balancing_loss, make_mesh, param_shardings, router_z_loss
from tests.models.hf_reference import hf_model, our_config_and_params

if jax.device_count() < 8:
    pytest.skip("needs 8 (fake) devices; tests/conftest.py sets them up", allow_module_level=True)

B, T = 8, 12


@pytest.fixture(scope="module")
def moe():
    # 8 experts and width 16 so "fsdp" (up to 8) and "tensor" (2) really split the expert leaves
    model = hf_model("qwen3_moe_norm_topk", vocab_size=128, num_experts=8, moe_intermediate_size=16)
    cfg, params = our_config_and_params(model)
    return cfg, jax.tree_util.tree_map(jnp.asarray, params)


def _loss_fn(cfg):
    def loss(params, tokens, mask, replay):
        out = forward(params, cfg, tokens, attention_mask=mask, routing=replay, return_routing=True)
        logp = jax.nn.log_softmax(out.out[:, :-1], axis=-1)
        picked = jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]
        nll = -jnp.sum(picked * mask[:, 1:]) / jnp.sum(mask[:, 1:])
        router = out.routing
        return (nll + 0.01 * load_balancing_loss(router.router_logits, cfg.num_experts_per_tok, mask, router.experts)
                + 0.001 * router_z_loss(router.router_logits, mask)), router.experts
    return jax.jit(jax.value_and_grad(loss, has_aux=True))


# (2, 2, 2) shards every axis at once (make test); (1, 4, 2), 4 experts over 4 fsdp devices, is make test-all's
@pytest.mark.parametrize("data, fsdp, tensor", [pytest.param(1, 4, 2, marks=pytest.mark.slow), (2, 2, 2)])
def test_mesh_loss_and_gradients_equal_one_device(moe, data, fsdp, tensor):
    cfg, params = moe
    rng = np.random.RandomState(6)
    tokens = jnp.asarray(rng.randint(0, 128, size=(B, T)), jnp.int32)
    mask = jnp.asarray((np.arange(T)[None, :] < rng.randint(6, T + 1, size=B)[:, None]).astype(np.int32))
    step = _loss_fn(cfg)
    (ref_loss, ref_experts), ref_grads = step(params, tokens, mask, None)

    mesh = make_mesh(data, fsdp, tensor)
    sharded = jax.device_put(params, param_shardings(params, mesh))
    expert_up = sharded["layers"]["expert_up"]  # [nL, E, D, F]: experts over fsdp, width over tensor
    assert expert_up.sharding.spec == P(None, "fsdp", None, "tensor")
    assert expert_up.addressable_shards[0].data.shape == (2, 8 // fsdp, 32, 16 // tensor)
    put = lambda x: jax.device_put(x, batch_sharding(mesh, x.ndim))  # noqa: E731
    for replay in (None, ref_experts):
        (loss, experts), grads = step(sharded, put(tokens), put(mask), None if replay is None else put(replay))
        assert len(loss.sharding.device_set) == 8
        np.testing.assert_array_equal(np.asarray(experts), np.asarray(ref_experts))
        np.testing.assert_allclose(float(loss), float(ref_loss), rtol=1e-5)
        for (path, got), want in zip(jax.tree_util.tree_leaves_with_path(grads), jax.tree_util.tree_leaves(ref_grads)):
            scale = float(jnp.max(jnp.abs(want)))
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-4, atol=1e-5 * scale,
                                       err_msg=jax.tree_util.keystr(path))
    assert float(jnp.abs(ref_grads["layers"]["router"]).max()) > 0
