"""The experts' two forms (``models.moe``): ragged (grouped matmuls over each expert's tokens,
``jax.lax.ragged_dot``) gives the dense form's logits and gradients, with and without routing replay;
"auto" is the dense form on CPU.

Tolerances come from float32 rounding (unit roundoff u = 2^-24): the two forms compute the same sums
in another order (ragged: over the F hidden units of each of a token's k experts, then over the k;
dense: over all E x F at once, the unselected ones exactly 0). A sum of n terms in float32 is off by
at most ~n u times the sum of its terms' magnitudes (Higham, "Accuracy and Stability of Numerical
Algorithms", 2002, eq. 3.5), so each layer's output differs by at most ~(E F + D) u times its scale,
and the L layers and the head add theirs: `_tolerance`.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import DecoderConfig, forward, init_params
from jaxrl_llm.models.moe import MOE_EXPERT_FORMS, moe_mlp, routed_experts

U = 2.0 ** -24  # float32 unit roundoff
CFG = DecoderConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, family="qwen3_moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    norm_topk_prob=True)
TOKENS = jnp.asarray(np.random.RandomState(0).randint(0, 97, size=(3, 20)))


def _tolerance(cfg: DecoderConfig, scale: float) -> float:
    """Rounding bound of the forms' difference: L layers, each a sum of E*F + D terms, at this scale."""
    return cfg.num_layers * (cfg.num_experts * cfg.moe_intermediate_size + cfg.hidden_size) * U * scale


def _cfg(form: str) -> DecoderConfig:
    return dataclasses.replace(CFG, moe_experts=form)


@pytest.fixture(scope="module")
def params():
    params = jax.jit(init_params, static_argnums=0)(CFG, jax.random.PRNGKey(0))
    # a replay record from a perturbed router: experts the model would not choose itself
    noise = 0.5 * jax.random.normal(jax.random.PRNGKey(7), params["layers"]["router"].shape)
    other = {**params, "layers": {**params["layers"], "router": params["layers"]["router"] + noise}}
    return params, jax.jit(lambda p: forward(p, CFG, TOKENS, return_routing=True).routing.experts)(other)


def _replay(recorded, use_replay: bool):
    if not use_replay:
        return None
    return recorded.at[:, -1].set(-1)  # the last token: no record, routed by the router's own top-k


@pytest.mark.parametrize("use_replay", [False, True], ids=["routed", "replayed"])
def test_ragged_logits_equal_dense(params, use_replay):
    params, recorded = params
    replay = _replay(recorded, use_replay)
    out = {form: jax.jit(lambda p, r, c=_cfg(form): forward(p, c, TOKENS, routing=r, return_routing=True))(params, replay)
           for form in ("dense", "ragged")}
    np.testing.assert_array_equal(np.asarray(out["ragged"].routing.experts), np.asarray(out["dense"].routing.experts))
    if use_replay:  # the replayed experts are the ones used
        np.testing.assert_array_equal(np.asarray(out["dense"].routing.experts[:, :-1]), np.asarray(recorded[:, :-1]))
    dense, ragged = np.asarray(out["dense"].out), np.asarray(out["ragged"].out)
    tol = _tolerance(CFG, np.abs(dense).max())
    assert np.abs(ragged - dense).max() <= tol, (np.abs(ragged - dense).max(), tol)


@pytest.mark.parametrize("use_replay", [False, True], ids=["routed", "replayed"])
def test_ragged_gradients_equal_dense(params, use_replay):
    """d(sum(y * w))/d(x, router, experts) of one MoE block (layer 0's weights) in both forms: the
    learner differentiates through the experts (the block is the only part the forms change)."""
    params, recorded = params
    layer = {name: params["layers"][name][0] for name in ("router", "expert_gate", "expert_up", "expert_down")}
    x = jax.random.normal(jax.random.PRNGKey(3), (*TOKENS.shape, CFG.hidden_size))
    replay = _replay(recorded[:, :, 0], use_replay)
    weights = jax.random.normal(jax.random.PRNGKey(1), x.shape)

    def grad(form):
        def loss(x, layer):
            return jnp.sum(moe_mlp(x, layer, CFG.num_experts_per_tok, CFG.norm_topk_prob, replay, form)[0] * weights)
        return jax.jit(jax.grad(loss, argnums=(0, 1)))(x, layer)

    dense, ragged = grad("dense"), grad("ragged")
    for (path, d), r in zip(jax.tree_util.tree_leaves_with_path(dense), jax.tree_util.tree_leaves(ragged)):
        d, r = np.asarray(d), np.asarray(r)
        tol = _tolerance(CFG, np.abs(d).max()) * 2  # the backward pass: about twice the sums
        assert np.abs(r - d).max() <= tol, (jax.tree_util.keystr(path), np.abs(r - d).max(), tol)
    assert np.abs(np.asarray(dense[1]["expert_down"])).max() > 0  # the experts learn at all
    assert np.abs(np.asarray(dense[1]["router"])).max() > 0  # and the router, through the gates


def test_experts_against_a_float64_loop():
    """Both forms against the formula token by token in float64, with a repeated expert in a row."""
    rng = np.random.RandomState(3)
    d, e, f = 6, 5, 4
    x = rng.normal(size=(2, 3, d)).astype(np.float32)
    w = {"expert_gate": rng.normal(size=(e, d, f)), "expert_up": rng.normal(size=(e, d, f)),
         "expert_down": rng.normal(size=(e, f, d))}
    w = {name: value.astype(np.float32) for name, value in w.items()}
    experts = np.array([[[4, 0], [1, 3], [2, 2]], [[0, 4], [3, 1], [1, 2]]], np.int32)
    gates = rng.uniform(size=(2, 3, 2)).astype(np.float32)
    want, scale = np.zeros((2, 3, d)), np.zeros((2, 3, d))
    for b, t in np.ndindex(2, 3):
        for gate, expert in zip(gates[b, t], experts[b, t]):
            g, u = x[b, t] @ w["expert_gate"][expert], x[b, t] @ w["expert_up"][expert]
            want[b, t] += gate * ((g / (1 + np.exp(-g)) * u) @ w["expert_down"][expert])
            scale[b, t] += abs(gate) * (np.abs(g * u) @ np.abs(w["expert_down"][expert]))
    for form in MOE_EXPERT_FORMS:
        y = routed_experts(jnp.asarray(x), {n: jnp.asarray(v) for n, v in w.items()}, jnp.asarray(experts),
                           jnp.asarray(gates), form)
        bound = (e * f + d + 8) * U * (scale.max() + np.abs(want).max())  # + the SwiGLU's elementwise roundings
        assert np.abs(np.asarray(y) - want).max() <= bound, (form, np.abs(np.asarray(y) - want).max(), bound)


def test_auto_is_dense_on_cpu_and_ragged_costs_more_there(params):
    """On CPU "auto" compiles the dense program (bitwise equal logits, equal FLOPs): XLA:CPU has no
    ragged matmul and JAX lowers ragged_dot to a masked dense product over all E groups."""
    params, _ = params
    programs = {form: jax.jit(lambda p, c=_cfg(form): forward(p, c, TOKENS)[0]).lower(params).compile()
                for form in MOE_EXPERT_FORMS}
    flops = {form: program.cost_analysis()["flops"] for form, program in programs.items()}
    np.testing.assert_array_equal(np.asarray(programs["auto"](params)), np.asarray(programs["dense"](params)))
    assert flops["auto"] == flops["dense"] < flops["ragged"]


def test_a_bad_expert_index_gives_nan_in_both_forms():
    x = jnp.ones((1, 2, 3))
    w = {"expert_gate": jnp.ones((2, 3, 4)), "expert_up": jnp.ones((2, 3, 4)), "expert_down": jnp.ones((2, 4, 3))}
    experts = jnp.array([[[0, 1], [1, 5]]], jnp.int32)  # expert 5 of 2
    gates = jnp.take_along_axis(jnp.full((1, 2, 2), 0.5), jnp.clip(experts, 0, 1), axis=-1)
    gates = jnp.where(experts < 2, gates, jnp.nan)  # models.moe.gate_weights fills a bad index with NaN
    for form in ("dense", "ragged"):
        y = np.asarray(routed_experts(x, w, experts, gates, form))
        assert np.isfinite(y[0, 0]).all() and np.isnan(y[0, 1]).all(), form


def test_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match=r"moe_experts='sparse' is not supported; valid: \('auto', 'ragged', 'dense'\)"):
        dataclasses.replace(CFG, moe_experts="sparse")


def test_auto_on_an_accelerator_has_ragged_values_and_dense_gradients(params):
    """What "auto" computes off CPU (`experts_ragged_dense_grad`): the ragged form's values, the dense
    form's gradients (with respect to x, the experts' weights and the gates), both bitwise."""
    from jaxrl_llm.models.moe import experts_ragged_dense_grad, experts_ragged

    params, recorded = params
    layer = {n: params["layers"][n][0] for n in ("expert_gate", "expert_up", "expert_down")}
    x = jax.random.normal(jax.random.PRNGKey(3), (*TOKENS.shape, CFG.hidden_size))
    experts = recorded[:, :, 0]
    gates = jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(4), experts.shape), axis=-1)
    weights = jax.random.normal(jax.random.PRNGKey(1), x.shape)
    hybrid = jax.jit(lambda x, w, g: experts_ragged_dense_grad(x, w, experts, g))
    ragged = jax.jit(lambda x, w, g: experts_ragged(x, w["expert_gate"], w["expert_up"], w["expert_down"], experts, g))
    np.testing.assert_array_equal(np.asarray(hybrid(x, layer, gates)), np.asarray(ragged(x, layer, gates)))

    def grads(form):
        loss = lambda x, w, g: jnp.sum(routed_experts(x, w, experts, g, form) * weights)  # noqa: E731
        return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))(x, layer, gates)

    dense = grads("dense")
    got = jax.jit(jax.grad(lambda x, w, g: jnp.sum(hybrid(x, w, g) * weights), argnums=(0, 1, 2)))(x, layer, gates)
    for d, h in zip(jax.tree_util.tree_leaves(dense), jax.tree_util.tree_leaves(got)):
        np.testing.assert_array_equal(np.asarray(h), np.asarray(d))
