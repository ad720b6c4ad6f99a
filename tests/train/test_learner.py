"""The learner step against independent references: PyTorch autograd through the
transformers model for the gradient, one-pass vs micro-batched vs sharded runs,
and hand-derived loss-scale behaviour."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import make_mesh, params_to_hf
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner
from tests.models.hf_reference import hf_model, our_config_and_params, torch

TEMPERATURE = 0.9
PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8], [70, 12], [33]]
G = 4
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def setup():
    model = hf_model("llama_tied", seed=5)
    cfg, params = our_config_and_params(model)
    rollouts = JaxSampler(cfg, params, eos_token_ids=[96]).generate(
        PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=3))
    seq = build_sequences(rollouts, completion_width=MAX_TOKENS, prompt_bucket=8)
    rewards = np.random.default_rng(0).integers(0, 2, size=(len(PROMPTS), G)).astype(np.float32)
    return model, cfg, params, seq, rewards


def make_learner(cfg, recipe, **train):
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "lr": 1e-3, **train})
    return Learner(cfg, recipe, train_cfg, total_steps=10, temperature=TEMPERATURE)


def step_batch_for(learner, params, seq, rewards):
    old_logp, _ = learner.logprobs(params, seq)
    batch, _ = core.prepare_step_batch(learner.recipe, core.StepInputs(jnp.asarray(rewards),
                                                                       jnp.asarray(seq.completion_mask), old_logp,
                                                                       jnp.asarray(seq.sampler_logp)))
    return batch


def test_old_logprobs_equal_sampler_logprobs(setup):
    _, cfg, params, seq, _ = setup
    learner = make_learner(cfg, core.get_recipe("grpo"))
    old_logp, entropy = learner.logprobs(learner.init(params).params, seq)
    mask = seq.completion_mask > 0
    np.testing.assert_allclose(np.asarray(old_logp)[mask], seq.sampler_logp[mask], atol=2e-5)
    assert np.all(np.asarray(entropy)[mask] > 0)


@pytest.mark.parametrize("recipe_name, remat", [("grpo", "off"), ("dr_grpo", "off"),
                                               pytest.param("grpo", "dots", marks=pytest.mark.slow)])
def test_gradient_matches_torch_autograd(setup, recipe_name, remat):
    """At pi = pi_old the PPO loss gradient is -sum_it w_it A_it d log pi_it: build that
    loss in PyTorch on the transformers model with the same tokens, positions and mask
    (also with train.remat=dots: what the layers keep must not change the gradient)."""
    model, cfg, params, seq, rewards = setup
    recipe = core.get_recipe(recipe_name, **({"constant_length": MAX_TOKENS} if recipe_name == "dr_grpo" else {}))
    learner = make_learner(cfg, recipe, micro_batch_size=4, remat=remat)
    state = learner.init(params)
    batch = step_batch_for(learner, state.params, seq, rewards)
    loss, grads, _ = learner.loss_and_grads(state.params, seq, batch)

    model.zero_grad()
    logits = model(torch.tensor(seq.tokens), attention_mask=torch.tensor(seq.attention_mask),
                   position_ids=torch.tensor(seq.positions.astype(np.int64))).logits.double()
    logp_all = torch.log_softmax(logits[:, :-1] / TEMPERATURE, dim=-1)
    logp = torch.gather(logp_all, 2, torch.tensor(seq.tokens[:, 1:].astype(np.int64))[..., None])[..., 0]
    w = seq.prompt_width
    logp = logp[:, w - 1:w - 1 + MAX_TOKENS]
    coef = torch.tensor(np.asarray(batch.loss_weights * batch.advantages * batch.correction_weights), dtype=torch.float64)
    ratio = torch.exp(logp - logp.detach())  # = 1 in value, d ratio = d log pi
    torch_loss = -(coef * ratio).sum()
    torch_loss.backward()
    np.testing.assert_allclose(float(loss), float(torch_loss.detach()), rtol=1e-5, atol=1e-7)
    ours = params_to_hf(jax.tree.map(np.asarray, grads), cfg)
    for name, param in model.named_parameters():
        ref = param.grad.double().numpy()
        scale = max(np.abs(ref).max(), 1e-8)
        assert np.abs(ours[name] - ref).max() / scale < 1e-4, name


def test_micro_batches_and_sharding_equal_one_pass(setup):
    _, cfg, params, seq, rewards = setup
    recipe = core.get_recipe("dapo")
    one = make_learner(cfg, recipe, micro_batch_size=16)
    state = one.init(params)
    batch = step_batch_for(one, state.params, seq, rewards)
    loss1, grads1, _ = one.loss_and_grads(state.params, seq, batch)
    micro = make_learner(cfg, recipe, micro_batch_size=2)
    loss2, grads2, _ = micro.loss_and_grads(state.params, seq, batch)
    sharded = Learner(cfg, recipe, micro.train_cfg, total_steps=10, temperature=TEMPERATURE,
                      mesh=make_mesh(data=2, fsdp=2, tensor=2))
    sharded_state = sharded.init(params)
    loss3, grads3, _ = sharded.loss_and_grads(sharded_state.params, seq, batch)
    for loss, grads in ((loss2, grads2), (loss3, grads3)):
        assert abs(float(loss) - float(loss1)) <= 1e-6
        diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads, grads1)
        assert max(jax.tree.leaves(diff)) <= 1e-6


def test_nonfinite_loss_skips_the_update(setup):
    _, cfg, params, seq, rewards = setup
    learner = make_learner(cfg, core.get_recipe("grpo"), micro_batch_size=16)
    state = learner.init(params)
    batch = step_batch_for(learner, state.params, seq, rewards)
    row, col = map(int, np.argwhere(seq.completion_mask > 0)[0])
    poisoned = batch._replace(old_logp=batch.old_logp.at[row, col].set(jnp.nan))
    before = jax.tree.map(np.asarray, state.params)
    new_state, metrics = learner.update(state, seq, poisoned)
    assert float(metrics["skipped"]) == 1.0
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, new_state.params), before)
    new_state, metrics = learner.update(new_state, seq, batch)
    assert float(metrics["skipped"]) == 0.0
    changed = jax.tree.map(lambda a, b: bool(np.any(np.asarray(a) != b)), new_state.params, before)
    assert all(jax.tree.leaves(changed))


def test_fp16_dynamic_loss_scale(setup):
    """Hand-derived schedule: an overflowing scale halves and skips; after
    growth_interval finite steps the scale doubles."""
    _, cfg, params, seq, rewards = setup
    learner = make_learner(cfg, core.get_recipe("grpo"), micro_batch_size=16, precision="fp16",
                           loss_scale_init=2.0 ** 120, loss_scale_growth_interval=2, loss_scale_min=1.0)
    state = learner.init(params)
    assert learner.compute_cfg.compute_dtype == "float16"
    batch = step_batch_for(learner, state.params, seq, rewards)
    state, metrics = learner.update(state, seq, batch)  # 2^120 * grads overflows fp16 -> inf
    assert float(metrics["skipped"]) == 1.0 and float(state.loss_scale.scale) == 2.0 ** 119
    state = state._replace(loss_scale=state.loss_scale._replace(scale=jnp.float32(1024.0)))
    scales = []
    for _ in range(3):
        state, metrics = learner.update(state, seq, batch)
        assert float(metrics["skipped"]) == 0.0
        scales.append(float(state.loss_scale.scale))
    assert scales == [1024.0, 2048.0, 2048.0]
    # master weights and optimiser state stay float32
    assert {x.dtype for x in jax.tree.leaves(state.params)} == {jnp.dtype(jnp.float32)}


def test_uneven_micro_batches_equal_one_pass(setup):
    """5 rows per micro-batch do not divide 16 sequences: the last micro-batch is part padding,
    and the sums still equal one pass (the weights are the step batch's)."""
    _, cfg, params, seq, rewards = setup
    recipe = core.get_recipe("grpo")
    one = make_learner(cfg, recipe, micro_batch_size=16, pack=False)
    state = one.init(params)
    batch = step_batch_for(one, state.params, seq, rewards)
    loss1, grads1, _ = one.loss_and_grads(state.params, seq, batch)
    uneven = make_learner(cfg, recipe, micro_batch_size=5, pack=False)
    assert uneven.plan(seq).tokens.shape[:2] == (4, 5)
    loss2, grads2, _ = uneven.loss_and_grads(state.params, seq, batch)
    assert abs(float(loss2) - float(loss1)) <= 1e-6
    diff = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), grads2, grads1)
    assert max(jax.tree.leaves(diff)) <= 1e-6


def test_remat_auto_takes_the_first_mode_that_fits(setup, monkeypatch):
    """train.remat=auto: with no device limit (CPU) "off"; with a budget between the compiled
    step's estimates for "full" and "off" (measured here on the same program) a remat mode, and
    the step's parameters equal those of the same step without remat."""
    from jaxrl_llm.models import remat as remat_lib
    from jaxrl_llm.train.learn import learner as learner_lib

    _, cfg, params, seq, rewards = setup
    recipe = core.get_recipe("grpo")
    plain = make_learner(cfg, recipe, micro_batch_size=16, remat="auto")
    state = plain.init(params)
    batch = step_batch_for(plain, state.params, seq, rewards)
    off_state, _ = plain.update(state, seq, batch)
    assert plain.remat == "off" and plain.remat_choice.budget is None

    probe = make_learner(cfg, recipe, micro_batch_size=16)
    plan = probe.plan(seq)
    args = (state, None, probe.place.rows(plan), probe.place.batch(batch))
    sizes = {mode: remat_lib.program_bytes(probe._update.lower(*args, max_segments=plan.max_segments,
                                                               remat=mode).compile()) for mode in ("off", "full")}
    assert sizes["full"] < sizes["off"]
    monkeypatch.setattr(learner_lib, "device_memory_budget", lambda: (sizes["full"] + sizes["off"]) // 2)
    tight = make_learner(cfg, recipe, micro_batch_size=16, remat="auto")
    tight_state, _ = tight.update(tight.init(params), seq, batch)
    assert tight.remat in ("dots", "full") and tight.remat_choice.estimates[tight.remat] <= tight.remat_choice.budget
    for a, b in zip(jax.tree.leaves(tight_state.params), jax.tree.leaves(off_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
