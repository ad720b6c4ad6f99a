"""Router losses and metrics: transformers' load-balancing loss, hand values, masked tokens ignored."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models.moe import Routing
from jaxrl_llm.models.router_losses import (expert_load, load_balancing_loss, router_entropy, router_metrics,
                                            router_z_loss)

torch = pytest.importorskip("torch")
qwen3_moe = pytest.importorskip("transformers.models.qwen3_moe.modeling_qwen3_moe")

B, T, L, E, K = 3, 7, 2, 5, 2


def _logits(seed=0):
    return np.random.RandomState(seed).normal(0, 2.0, size=(B, T, L, E)).astype(np.float32)


def _transformers_loss(logits, mask=None):
    """transformers' load_balancing_loss_func: a tuple of per-layer [B*T, E] logits."""
    per_layer = tuple(torch.tensor(logits[:, :, layer].reshape(B * T, E)) for layer in range(L))
    return float(qwen3_moe.load_balancing_loss_func(per_layer, E, K, None if mask is None else torch.tensor(mask)))


def test_load_balancing_loss_equals_transformers():
    logits = _logits()
    mask = (np.arange(T)[None, :] < np.array([7, 4, 2])[:, None]).astype(np.int64)
    assert float(load_balancing_loss(jnp.asarray(logits), K)) == pytest.approx(_transformers_loss(logits), rel=1e-6)
    ours = float(load_balancing_loss(jnp.asarray(logits), K, jnp.asarray(mask)))
    assert ours == pytest.approx(_transformers_loss(logits, mask), rel=1e-6)
    # padding does not count: changing the padded tokens' logits leaves the loss alone
    changed = np.where(mask[:, :, None, None] == 1, logits, 50.0 * np.eye(E, dtype=np.float32)[0])
    assert float(load_balancing_loss(jnp.asarray(changed), K, jnp.asarray(mask))) == pytest.approx(ours, rel=1e-6)


def test_load_balancing_loss_hand_value_with_given_experts():
    # one layer, two tokens, E=2, k=1: uniform probabilities, both tokens on expert 0
    logits = jnp.zeros((1, 2, 1, 2))
    experts = jnp.zeros((1, 2, 1, 1), jnp.int32)
    # f = (1, 0), P = (1/2, 1/2) -> 2 * (1 * 1/2) = 1
    assert float(load_balancing_loss(logits, 1, experts=experts)) == pytest.approx(1.0)


def test_router_z_loss_hand_value_and_mask():
    # token 1: logits (0,0,0,0) -> lse = log 4; token 2: (log 3, 0, 0, 0) -> lse = log 6; token 3 padding
    logits = jnp.asarray([[[[0.0, 0, 0, 0]], [[np.log(3.0), 0, 0, 0]], [[100.0, 0, 0, 0]]]])
    mask = jnp.asarray([[1, 1, 0]])
    want = (np.log(4.0) ** 2 + np.log(6.0) ** 2) / 2
    assert float(router_z_loss(logits, mask)) == pytest.approx(want, rel=1e-6)


def test_expert_load_and_entropy_hand_values():
    # one layer, E=4, k=2: tokens route to (0,1), (0,2), (0,1); a padded token to (3,3) must not count
    experts = jnp.asarray([[[[0, 1]], [[0, 2]], [[0, 1]], [[3, 3]]]], jnp.int32)
    mask = jnp.asarray([[1, 1, 1, 0]])
    np.testing.assert_allclose(expert_load(experts, 4, mask), [[3 / 6, 2 / 6, 1 / 6, 0.0]], rtol=1e-6)
    # uniform router (entropy log 4) on two valid tokens, a near one-hot one (entropy ~0), padding uniform
    logits = jnp.asarray([[[[0.0, 0, 0, 0]], [[0.0, 0, 0, 0]], [[0.0, -80, -80, -80]], [[0.0, 0, 0, 0]]]])
    np.testing.assert_allclose(router_entropy(logits, mask), [2 * np.log(4.0) / 3], rtol=1e-6)
    metrics = router_metrics(Routing(experts, logits), mask)
    np.testing.assert_allclose(metrics.load_max_over_mean, [(3 / 6) / (1 / 4)], rtol=1e-6)  # = 2
    np.testing.assert_allclose(metrics.entropy, [2 * np.log(4.0) / 3], rtol=1e-6)


def test_bad_mask_shape_names_it():
    with pytest.raises(ValueError, match=r"mask has shape \(3, 6\); valid: the routing's \[batch, time\] \(3, 7\)"):
        router_z_loss(jnp.asarray(_logits()), jnp.ones((3, 6)))


def test_losses_are_differentiable_in_the_logits():
    grad = jax.grad(lambda x: load_balancing_loss(x, K) + router_z_loss(x))(jnp.asarray(_logits()))
    assert np.all(np.isfinite(grad)) and float(jnp.abs(grad).sum()) > 0
