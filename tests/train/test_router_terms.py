"""Router losses and metrics of a mixture-of-experts policy in the learner's gradient pass
(train/learn/router_terms.py), against an independent reference: one plain forward over the
unpacked [N, W] batch with ``return_routing`` and `models.router_losses` over its real tokens
(attention_mask = 1), differentiated with a plain jax.grad."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import DecoderConfig, forward, init_params
from jaxrl_llm.models.router_losses import load_balancing_loss, router_metrics, router_z_loss
from jaxrl_llm.train.config import ConfigError, TrainConfig, config_from_dict
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.learn.learner import Learner

P, G, PROMPT_WIDTH, COMPLETION_WIDTH = 2, 4, 8, 6
COEFS = dict(router_aux_loss_coef=0.3, router_z_loss_coef=0.02)
MOE_HF = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
          "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
          "norm_topk_prob": True, "tie_word_embeddings": False}


def _sequences(seed: int = 0, pad_id: int = 0) -> SequenceBatch:
    """N = P x G rows [left-padded prompt | completion | right padding] of random lengths."""
    rng = np.random.default_rng(seed)
    n, width = P * G, PROMPT_WIDTH + COMPLETION_WIDTH
    tokens = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    completion_mask = np.zeros((n, COMPLETION_WIDTH), np.float32)
    for i in range(n):
        p, c = rng.integers(1, PROMPT_WIDTH + 1), rng.integers(1, COMPLETION_WIDTH + 1)
        tokens[i, PROMPT_WIDTH - p:PROMPT_WIDTH + c] = rng.integers(1, 64, size=p + c)
        attention[i, PROMPT_WIDTH - p:PROMPT_WIDTH + c] = 1
        completion_mask[i, :c] = 1.0
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
    return SequenceBatch(tokens, attention, positions, completion_mask, np.zeros_like(completion_mask),
                         np.zeros(n, bool), PROMPT_WIDTH)


@pytest.fixture(scope="module")
def setup():
    cfg = DecoderConfig.from_hf(MOE_HF)
    params = init_params(cfg, jax.random.PRNGKey(0))
    # a sharper router than init's normal(0.02): uneven loads, entropies well below log E
    params["layers"]["router"] = params["layers"]["router"] * 60.0
    rewards = np.random.default_rng(1).integers(0, 2, size=(P, G)).astype(np.float32)
    return cfg, params, _sequences(), rewards


def _learner(cfg, **train) -> Learner:
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "remat": "off", **train})
    return Learner(cfg, core.get_recipe("grpo"), train_cfg, total_steps=10)


def _step_batch(learner, params, seq, rewards):
    old_logp, _ = learner.logprobs(params, seq)
    return core.prepare_step_batch(learner.recipe, core.StepInputs(
        jnp.asarray(rewards), jnp.asarray(seq.completion_mask), old_logp, jnp.asarray(seq.sampler_logp)))[0]


def _reference_routing(params, cfg, seq, rows=slice(None)):
    """The unpacked batch's routing (rows `rows`) and its real-token mask."""
    out = forward(params, cfg, jnp.asarray(seq.tokens[rows]), positions=jnp.asarray(seq.positions[rows]),
                  segment_ids=jnp.asarray(seq.attention_mask[rows]), return_routing=True)
    return out.routing, jnp.asarray(seq.attention_mask[rows])


def _jitted(fn, cfg, seq, *args):
    """fn(params, cfg, seq, *args) compiled once over params (the rest are constants): the eager
    reference dispatches the tiny MoE op by op, several times slower than one program."""
    return jax.jit(lambda params: fn(params, cfg, seq, *args))


def _reference_losses(params, cfg, seq, groups):
    """(load-balancing, z) losses: each group of rows' own, weighted by its share of the real tokens."""
    total = seq.attention_mask.sum()
    balancing = z = 0.0
    for rows in groups:
        routing, mask = _reference_routing(params, cfg, seq, rows)
        share = seq.attention_mask[rows].sum() / total
        balancing += share * load_balancing_loss(routing.router_logits, cfg.num_experts_per_tok, mask)
        z += share * router_z_loss(routing.router_logits, mask)
    return balancing, z


# one micro-batch (the mini-batch's own losses) is make test-all's; several micro-batches (token-weighted) make test's
@pytest.mark.parametrize("micro_batch_size", [pytest.param(8, marks=pytest.mark.slow), 2])
def test_loss_and_gradient_add_coef_times_the_router_losses(setup, micro_batch_size):
    """loss(coefs) - loss(0) = c_aux * LB + c_z * z and the same for the gradients (a plain jax.grad
    of the unpacked reference); with several micro-batches LB is each micro-batch's own, token-weighted."""
    cfg, params, seq, rewards = setup
    plain, with_router = (_learner(cfg, micro_batch_size=micro_batch_size, pack=False, **coefs)
                          for coefs in ({}, COEFS))
    batch = _step_batch(plain, params, seq, rewards)
    loss0, grads0, _ = plain.loss_and_grads(params, seq, batch)
    loss1, grads1, metrics = with_router.loss_and_grads(params, seq, batch)
    membership = with_router.plan(seq).micro_batch  # which micro-batch holds each sequence
    groups = [np.flatnonzero(membership == m) for m in np.unique(membership)]
    assert len(groups) == P * G // micro_batch_size

    def router_loss(p):
        balancing, z = _reference_losses(p, cfg, seq, groups)
        return COEFS["router_aux_loss_coef"] * balancing + COEFS["router_z_loss_coef"] * z, (balancing, z)

    (expected, (balancing, z)), expected_grads = jax.jit(jax.value_and_grad(router_loss, has_aux=True))(params)
    np.testing.assert_allclose(float(loss1) - float(loss0), float(expected), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(float(metrics["router/load_balancing_loss"]), float(balancing), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["router/z_loss"]), float(z), rtol=1e-5)
    diff = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), grads1, grads0)
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(expected_grads))
    for got, want in zip(jax.tree.leaves(diff), jax.tree.leaves(expected_grads)):
        np.testing.assert_allclose(got, np.asarray(want), atol=2e-5 * scale)
    assert np.abs(np.asarray(expected_grads["layers"]["router"])).max() > 0.01 * scale  # the router is reached


@pytest.fixture(scope="module")
def reference_metrics(setup):
    """(router_metrics, z-loss) of the whole unpacked batch's real tokens, one compiled program."""
    cfg, params, seq, _ = setup

    def metrics_and_z(p, cfg, seq):
        routing, mask = _reference_routing(p, cfg, seq)
        return router_metrics(routing, mask), _reference_losses(p, cfg, seq, [slice(None)])[1]

    return _jitted(metrics_and_z, cfg, seq)(params)


# one row per sequence (the gradient test's one micro-batch) is make test-all's; make test keeps the
# layouts with other padding slots: several micro-batches and packed rows
@pytest.mark.parametrize("layout", [pytest.param(dict(micro_batch_size=8, pack=False), marks=pytest.mark.slow),
                                    dict(micro_batch_size=2, pack=False), dict(micro_batch_tokens=28, pack=True)])
def test_metrics_equal_router_metrics_of_the_batch_whatever_the_padding(setup, reference_metrics, layout):
    """Per-layer load max/mean and entropy equal `router_metrics` over the unpacked batch's real
    tokens, for one row per sequence, several micro-batches and packed rows (each lays out other
    padding slots), and with another padding token id."""
    cfg, params, seq, rewards = setup
    want, z = reference_metrics
    assert float(jnp.max(want.load_max_over_mean)) > 1.2  # uneven: a wrong token set shows
    learner = _learner(cfg, **layout)
    batch = _step_batch(learner, params, seq, rewards)
    for sequences in (seq, _sequences(pad_id=7)):
        _, _, metrics = learner.loss_and_grads(params, sequences, batch)
        for layer in range(cfg.num_layers):
            np.testing.assert_allclose(float(metrics[f"router/load_max_over_mean/layer{layer}"]),
                                       float(want.load_max_over_mean[layer]), rtol=1e-6)
            np.testing.assert_allclose(float(metrics[f"router/entropy/layer{layer}"]),
                                       float(want.entropy[layer]), rtol=1e-5)
        np.testing.assert_allclose(float(metrics["router/z_loss"]), float(z), rtol=1e-5)  # splits exactly


@pytest.mark.slow  # 52 s at load 10 on 2 cores
def test_an_eight_device_mesh_gives_the_one_device_router_terms(setup):
    """Mesh data=2 x fsdp=2 x tensor=2 (experts over fsdp): the same loss, gradients and router metrics."""
    from jaxrl_llm.models import make_mesh

    cfg, params, seq, rewards = setup
    one = _learner(cfg, micro_batch_size=4, **COEFS)
    batch = _step_batch(one, params, seq, rewards)
    loss1, grads1, metrics1 = one.loss_and_grads(params, seq, batch)
    sharded = Learner(cfg, one.recipe, one.train_cfg, total_steps=10, mesh=make_mesh(data=2, fsdp=2, tensor=2))
    loss2, grads2, metrics2 = sharded.loss_and_grads(sharded.init(params).params, seq, batch)
    assert abs(float(loss2) - float(loss1)) <= 1e-6
    assert max(jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads2, grads1))) <= 1e-6
    for name in metrics1:
        if name.startswith("router/"):
            np.testing.assert_allclose(float(metrics2[name]), float(metrics1[name]), rtol=1e-6, err_msg=name)


def test_update_reports_the_router_metrics_and_steps(setup):
    """`update` (what learn() averages into metrics.jsonl) carries the router metrics as floats."""
    cfg, params, seq, rewards = setup
    learner = _learner(cfg, micro_batch_size=4, lr=1e-3, **COEFS)
    state = learner.init(params)
    batch = _step_batch(learner, state.params, seq, rewards)
    _, metrics = learner.update(state, seq, batch)
    names = {"router/load_balancing_loss", "router/z_loss"} | {
        f"router/{kind}/layer{i}" for kind in ("load_max_over_mean", "entropy") for i in range(cfg.num_layers)}
    assert names <= set(metrics) and all(np.isfinite(float(metrics[k])) for k in names)
    assert float(metrics["skipped"]) == 0.0


def test_coefficients_are_refused_when_negative_or_with_a_dense_policy(setup):
    with pytest.raises(ConfigError, match=r"train.router_aux_loss_coef = -0.1 is out of range; valid: >= 0.0"):
        config_from_dict({"train": {"router_aux_loss_coef": -0.1}})
    dense = DecoderConfig.from_hf({**MOE_HF, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
                                   "num_experts": 0, "num_experts_per_tok": 0, "moe_intermediate_size": 0})
    assert not dense.is_moe
    with pytest.raises(ValueError, match=r"train.router_z_loss_coef=0.001 needs a mixture-of-experts policy.*"
                                         r"valid: 0.0"):
        _learner(dense, router_z_loss_coef=0.001)
    _learner(dense)  # zeros are fine


@pytest.mark.slow
def test_a_moe_run_writes_the_router_metrics_to_metrics_jsonl(tmp_path):
    """One step of the demo run with a tiny random Qwen3-MoE policy (JAX engine): metrics.jsonl has
    every router metric, within its range (entropy <= log E, load max / mean in [1, E / k])."""
    from jaxrl_llm import bridge
    from jaxrl_llm.models.config import tiny_decoder_config
    from jaxrl_llm.train.run import loop
    from jaxrl_llm.train.run.metrics import read_metrics
    from tests.train.tiny_run import tiny_config

    cfg = tiny_decoder_config(family="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16,
                              norm_topk_prob=True, tie_word_embeddings=False)
    bridge.save_hf_dir(cfg, init_params(cfg, jax.random.key(0)), tmp_path / "model",
                       tokenizer_dir=bridge.smollm2_hf_dir())
    run = tiny_config(str(tmp_path / "model"), tmp_path / "run", "total_steps=1", "checkpoint.every_steps=0",
                      "train.router_aux_loss_coef=0.01", "train.router_z_loss_coef=0.001")
    loop.train(run)
    (row,) = read_metrics(run.run_path)
    for layer in range(cfg.num_layers):
        assert 0.0 < row[f"router/entropy/layer{layer}"] <= np.log(4) + 1e-6
        assert 1.0 <= row[f"router/load_max_over_mean/layer{layer}"] <= 4 / 2
    assert row["router/load_balancing_loss"] > 0 and row["router/z_loss"] > 0
