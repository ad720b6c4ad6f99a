"""Routing record and replay (R3) in the MoE forward: recorded experts, bitwise self-replay,
replay pins the experts of a perturbed model, gates from the current router, the cached path."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import forward, init_cache
from jaxrl_llm.models.moe import RoutedForward, Routing, moe_mlp
from tests.models.hf_reference import hf_model, our_config_and_params, torch

TOKENS = np.random.RandomState(2).randint(0, 97, size=(2, 16))


@pytest.fixture(scope="module")
def moe():
    model = hf_model("qwen3_moe_norm_topk")
    cfg, params = our_config_and_params(model)
    return model, cfg, jax.tree_util.tree_map(jnp.asarray, params)


def test_recorded_experts_are_transformers_top_k(moe):
    model, cfg, params = moe
    out = forward(params, cfg, jnp.asarray(TOKENS), return_routing=True)
    assert isinstance(out, RoutedForward) and isinstance(out.routing, Routing) and out.cache is None
    assert out.routing.experts.shape == (2, 16, 2, 2) and out.routing.experts.dtype == jnp.int32
    assert out.routing.router_logits.shape == (2, 16, 2, 4)
    with torch.no_grad():
        hf = model(torch.tensor(TOKENS), output_router_logits=True)
    for layer, logits in enumerate(hf.router_logits):  # [B*T, E] per layer
        hf_experts = torch.topk(torch.softmax(logits, -1), 2, dim=-1).indices.numpy().reshape(2, 16, 2)
        np.testing.assert_array_equal(np.asarray(out.routing.experts[:, :, layer]), hf_experts)
        np.testing.assert_allclose(np.asarray(out.routing.router_logits[:, :, layer]),
                                   logits.numpy().reshape(2, 16, 4), rtol=1e-5, atol=1e-5)


def test_replaying_own_routing_is_bitwise_equal(moe):
    _, cfg, params = moe
    step = jax.jit(lambda p, t, r: forward(p, cfg, t, routing=r, return_routing=True))
    recorded = step(params, jnp.asarray(TOKENS), None)  # both compiled: the same ops in the same programs
    replayed = step(params, jnp.asarray(TOKENS), recorded.routing.experts)
    np.testing.assert_array_equal(np.asarray(replayed.out), np.asarray(recorded.out))
    np.testing.assert_array_equal(np.asarray(replayed.routing.experts), np.asarray(recorded.routing.experts))
    by_routing = jax.jit(lambda p, t, r: forward(p, cfg, t, routing=r)[0])(params, jnp.asarray(TOKENS),
                                                                          recorded.routing)  # a Routing works too
    np.testing.assert_array_equal(np.asarray(by_routing), np.asarray(recorded.out))


def _perturbed(params, scale=0.5, seed=7):
    noise = jax.random.normal(jax.random.PRNGKey(seed), params["layers"]["router"].shape)
    layers = {**params["layers"], "router": params["layers"]["router"] + scale * noise}
    return {**params, "layers": layers}


def test_replay_pins_the_experts_of_a_perturbed_model(moe):
    _, cfg, params = moe
    recorded = forward(params, cfg, jnp.asarray(TOKENS), return_routing=True).routing
    other = _perturbed(params)
    free = forward(other, cfg, jnp.asarray(TOKENS), return_routing=True)
    assert np.mean(np.asarray(free.routing.experts) != np.asarray(recorded.experts)) > 0.05  # the perturbation matters
    pinned = forward(other, cfg, jnp.asarray(TOKENS), routing=recorded.experts, return_routing=True)
    np.testing.assert_array_equal(np.asarray(pinned.routing.experts), np.asarray(recorded.experts))
    assert not np.array_equal(np.asarray(pinned.out), np.asarray(free.out))


@pytest.mark.parametrize("normalize", [True, False])
def test_replayed_gates_are_the_current_routers_probabilities(normalize):
    """moe_mlp with given experts against a per-token numpy loop of the formula (module docstring)."""
    rng = np.random.RandomState(3)
    d, e, f, k = 6, 5, 4, 2
    x = rng.normal(size=(1, 3, d)).astype(np.float32)
    w = {"router": rng.normal(size=(d, e)), "expert_gate": rng.normal(size=(e, d, f)),
         "expert_up": rng.normal(size=(e, d, f)), "expert_down": rng.normal(size=(e, f, d))}
    w = {name: value.astype(np.float32) for name, value in w.items()}
    replay = np.array([[[4, 0], [1, 3], [2, 2 - 1]]], np.int32)  # not necessarily the router's own top-2
    y, routing = moe_mlp(jnp.asarray(x), {n: jnp.asarray(v) for n, v in w.items()}, k, normalize, jnp.asarray(replay))
    np.testing.assert_array_equal(np.asarray(routing.experts), replay)
    for t in range(3):
        logits = x[0, t].astype(np.float64) @ w["router"]
        probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
        gates = probs[replay[0, t]] / (probs[replay[0, t]].sum() if normalize else 1.0)
        want = np.zeros(d)
        for gate, expert in zip(gates, replay[0, t]):
            g, u = x[0, t] @ w["expert_gate"][expert], x[0, t] @ w["expert_up"][expert]
            want += gate * ((g / (1 + np.exp(-g)) * u) @ w["expert_down"][expert])
        np.testing.assert_allclose(np.asarray(y[0, t]), want, rtol=1e-4, atol=1e-5)


def test_gradients_reach_the_router_under_replay(moe):
    _, cfg, params = moe
    recorded = forward(params, cfg, jnp.asarray(TOKENS), return_routing=True).routing.experts
    other = _perturbed(params, scale=0.2)
    weights = jax.random.normal(jax.random.PRNGKey(1), (2, 16, cfg.vocab_size))

    def loss(router):
        p = {**other, "layers": {**other["layers"], "router": router}}
        return jnp.sum(forward(p, cfg, jnp.asarray(TOKENS), routing=recorded)[0] * weights)

    router = other["layers"]["router"]
    grad = jax.grad(loss)(router)
    assert float(jnp.abs(grad).max()) > 0
    direction = jax.random.normal(jax.random.PRNGKey(2), router.shape)
    eps = 1e-3  # replay fixes the experts, so the loss is smooth in the router: central differences apply
    numeric = (loss(router + eps * direction) - loss(router - eps * direction)) / (2 * eps)
    assert float(jnp.sum(grad * direction)) == pytest.approx(float(numeric), rel=1e-3)


def test_cached_prefill_and_decode_record_and_replay(moe):
    _, cfg, params = moe
    prompt, steps = 10, 6
    full = forward(params, cfg, jnp.asarray(TOKENS), return_routing=True)
    step = jax.jit(lambda p, t, c, r: forward(p, cfg, t, cache=c, routing=r, return_routing=True))
    for replay in (False, True):
        cache = init_cache(cfg, batch=2, max_len=prompt + steps)
        given = full.routing.experts[:, :prompt] if replay else None
        out = step(params, jnp.asarray(TOKENS[:, :prompt]), cache, given)
        experts, logits, cache = [out.routing.experts], [out.out], out.cache
        for t in range(prompt, prompt + steps):
            given = full.routing.experts[:, t:t + 1] if replay else None
            out = step(params, jnp.asarray(TOKENS[:, t:t + 1]), cache, given)
            experts.append(out.routing.experts)
            logits.append(out.out)
            cache = out.cache
        np.testing.assert_array_equal(np.concatenate(experts, axis=1), np.asarray(full.routing.experts))
        np.testing.assert_allclose(np.concatenate(logits, axis=1), np.asarray(full.out), rtol=1e-5, atol=1e-5)


def test_bad_routing_is_named(moe):
    _, cfg, params = moe
    with pytest.raises(ValueError, match=r"routing experts have shape \(2, 16, 2, 3\); valid: \(2, 16, 2, 2\)"):
        forward(params, cfg, jnp.asarray(TOKENS), routing=jnp.zeros((2, 16, 2, 3), jnp.int32))
    dense_cfg, dense = our_config_and_params(hf_model("qwen3_qk_norm"))
    with pytest.raises(ValueError, match="routing replay needs a mixture-of-experts config"):
        forward(dense, dense_cfg, jnp.asarray(TOKENS), routing=jnp.zeros((2, 16, 2, 2), jnp.int32))
    with pytest.raises(ValueError, match="return_routing=True needs a mixture-of-experts config"):
        forward(dense, dense_cfg, jnp.asarray(TOKENS), return_routing=True)


def test_a_row_of_minus_one_routes_by_the_routers_own_top_k(moe):
    """-1 rows (no record: padding, the last sampled token) against a second formulation: the same
    forward replaying a record with the router's own top-k written into those rows, bitwise."""
    _, cfg, params = moe
    recorded = np.asarray(forward(params, cfg, jnp.asarray(TOKENS), return_routing=True).routing.experts)
    other = _perturbed(params)  # its own top-k differs from the record
    record = recorded.copy()
    record[0, 5:9] = -1  # whole token rows (every layer) without a record
    record[1, -1] = -1   # the last token of a row, as the sampler leaves it
    record[1, 3, 1, 0] = -1  # one negative entry marks the whole token row (this layer's k entries)
    step = jax.jit(lambda p, t, r: forward(p, cfg, t, routing=r, return_routing=True))
    mixed = step(other, jnp.asarray(TOKENS), jnp.asarray(record))
    used = np.asarray(mixed.routing.experts)
    assert np.all(used >= 0) and np.all(np.isfinite(np.asarray(mixed.out)))  # no -1 reached the gates
    keep = np.all(record >= 0, axis=-1)  # [B, T, nL]: rows replayed as recorded
    np.testing.assert_array_equal(used[keep], record[keep])
    free_first_layer = np.asarray(forward(other, cfg, jnp.asarray(TOKENS), return_routing=True).routing.experts)[:, :, 0]
    np.testing.assert_array_equal(used[:, :, 0][~keep[:, :, 0]], free_first_layer[~keep[:, :, 0]])  # own top-k
    assert not np.array_equal(used[~keep], recorded[~keep])  # the fallback is not the record there
    written = step(other, jnp.asarray(TOKENS), jnp.asarray(used))  # own top-k written into those rows
    np.testing.assert_array_equal(np.asarray(written.out), np.asarray(mixed.out))
    np.testing.assert_array_equal(np.asarray(written.routing.experts), used)
