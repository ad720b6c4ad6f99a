"""The reference policy of the KL term against independent computations: a separate
full-logits forward pass of the initial params (fp32, bf16), the LoRA base, the sharded
learner vs one device, and its memory cost counted by hand."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import forward, make_mesh
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner
from tests.train.reference_setup import G, PROMPTS, TEMPERATURE, sampled_setup, separate_forward_logprobs


@pytest.fixture(scope="module")
def setup():
    return sampled_setup()


def make_learner(cfg, mesh=None, **train):
    train_cfg = dataclasses.replace(TrainConfig(), **{"precision": "fp32", "lr": 1e-2, "micro_batch_size": 4,
                                                      **train})
    return Learner(cfg, core.get_recipe("grpo", kl_beta=0.1), train_cfg, total_steps=10,
                   temperature=TEMPERATURE, mesh=mesh)


def train_steps(learner, state, seq, rewards, steps=3):
    for _ in range(steps):
        out = learner.step_logprobs(state.params, seq)
        batch, _ = core.prepare_step_batch(learner.recipe, core.StepInputs(jnp.asarray(rewards),
                                                                           jnp.asarray(seq.completion_mask), out.logp,
                                                                           jnp.asarray(seq.sampler_logp),
                                                                           ref_logp=out.ref_logp))
        state, _ = learner.update(state, seq, batch)
    return state


def test_reference_logprobs_equal_a_separate_forward_of_the_initial_params(setup):
    cfg, params, seq, rewards = setup
    learner = make_learner(cfg)
    state = train_steps(learner, learner.init(params), seq, rewards)
    out = learner.step_logprobs(state.params, seq)
    mask = seq.completion_mask > 0
    # a separate pass of the initial params through a learner without a reference: the same kernels
    separate, _ = Learner(cfg, core.get_recipe("grpo"), learner.train_cfg, total_steps=1,
                          temperature=TEMPERATURE).logprobs(params, seq)
    np.testing.assert_allclose(np.asarray(out.ref_logp)[mask], np.asarray(separate)[mask], atol=1e-6, rtol=0)
    # and one full-logits forward (other reduction order: fp32 rounding, ~1e-6 relative)
    expected = separate_forward_logprobs(params, cfg, seq, jnp.float32)
    np.testing.assert_allclose(np.asarray(out.ref_logp)[mask], expected[mask], atol=0, rtol=2e-6)
    moved = separate_forward_logprobs(state.params, cfg, seq, jnp.float32)
    np.testing.assert_allclose(np.asarray(out.logp)[mask], moved[mask], atol=1e-5, rtol=0)
    assert np.max(np.abs(moved - expected)[mask]) > 1e-2  # the policy moved away from the reference
    n_params = sum(x.size for x in jax.tree.leaves(params))
    assert learner.reference_bytes == 4 * n_params


def test_bf16_reference_follows_the_precision_policy(setup):
    cfg, params, seq, _ = setup
    learner = make_learner(cfg, precision="bf16")
    learner.init(params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(learner.reference))
    assert learner.reference_bytes == 2 * sum(x.size for x in jax.tree.leaves(params))
    out = learner.step_logprobs(jax.tree.map(jnp.zeros_like, params), seq)  # reference unaffected by params
    mask = seq.completion_mask > 0
    expected = separate_forward_logprobs(params, cfg, seq, jnp.bfloat16)
    np.testing.assert_allclose(np.asarray(out.ref_logp)[mask], expected[mask], atol=2e-2, rtol=0)
    fp32 = separate_forward_logprobs(params, cfg, seq, jnp.float32)
    assert np.max(np.abs(np.asarray(out.ref_logp) - fp32)[mask]) > 0  # computed in bf16, not fp32


def test_lora_reference_is_the_frozen_base_at_no_extra_memory(setup):
    cfg, params, seq, rewards = setup
    learner = make_learner(cfg, lora_rank=2)
    state = train_steps(learner, learner.init(params), seq, rewards)
    assert learner.reference is None and learner.reference_bytes == 0
    out = learner.step_logprobs(state.params, seq)
    mask = seq.completion_mask > 0
    expected = separate_forward_logprobs(params, cfg, seq, jnp.float32)
    np.testing.assert_allclose(np.asarray(out.ref_logp)[mask], expected[mask], atol=0, rtol=2e-6)
    assert np.max(np.abs(np.asarray(out.logp) - expected)[mask]) > 1e-3  # the adapters moved the policy


def test_sharded_reference_equals_one_device(setup):
    cfg, params, seq, rewards = setup
    single = make_learner(cfg)
    state = train_steps(single, single.init(params), seq, rewards, steps=1)
    mesh = make_mesh(data=2, fsdp=4, tensor=1)
    sharded = make_learner(cfg, mesh=mesh)
    sharded_state = train_steps(sharded, sharded.init(params), seq, rewards, steps=1)
    leaf = jax.tree.leaves(sharded.reference)[0]
    assert len(leaf.sharding.device_set) == 8
    a, b = single.step_logprobs(state.params, seq), sharded.step_logprobs(sharded_state.params, seq)
    mask = seq.completion_mask > 0
    np.testing.assert_allclose(np.asarray(b.ref_logp)[mask], np.asarray(a.ref_logp)[mask], atol=1e-5, rtol=0)
    np.testing.assert_allclose(np.asarray(b.logp)[mask], np.asarray(a.logp)[mask], atol=1e-3, rtol=0)  # Adam amplifies rounding


def first_token_distribution(params, cfg):
    """float64 [len(PROMPTS), V]: the exact next-token distribution after each prompt at TEMPERATURE."""
    rows = []
    for prompt in PROMPTS:
        logits, _ = forward(params, cfg, jnp.asarray([prompt]))
        rows.append(np.asarray(jax.nn.softmax(logits[0, -1].astype(jnp.float32) / TEMPERATURE), np.float64))
    return np.stack(rows)


def run_even_first_token_task(cfg, params, kl_beta: float, steps: int = 10):
    """GRPO on 'the first completion token is even' (reward 1, else 0), sampled by the JAX
    sampler from the current policy each step with seeds 0..steps-1: the same seed for
    every kl_beta. Returns the final params."""
    learner = make_learner(cfg, micro_batch_size=8)
    learner = Learner(cfg, core.get_recipe("grpo", kl_beta=kl_beta, kl_estimator="k3"), learner.train_cfg,
                      total_steps=steps, temperature=TEMPERATURE)
    state = learner.init(params)
    prepare = jax.jit(lambda *args: core.prepare_step_batch(learner.recipe,
                                                            core.StepInputs(*args[:4], ref_logp=args[4])))
    for step in range(steps):
        rollouts = JaxSampler(cfg, state.params, eos_token_ids=[96]).generate(
            PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE, max_tokens=3, seed=step))
        seq = build_sequences(rollouts, completion_width=3, prompt_bucket=8)
        rewards = np.array([r.completion_token_ids[0] % 2 == 0 for r in rollouts.records],
                           np.float32).reshape(len(PROMPTS), G)
        out = learner.step_logprobs(state.params, seq)
        batch, _ = prepare(rewards, seq.completion_mask, out.logp, seq.sampler_logp, out.ref_logp)
        state, _ = learner.update(state, seq, batch)
    return state.params


def test_large_kl_beta_ends_closer_to_the_reference_than_no_kl(setup):
    """Same seed, same steps: the KL term holds the policy near pi_ref while kl_beta = 0 drifts.
    KL is measured exactly (sum over the vocabulary) at each prompt's first completion token."""
    cfg, params, _, _ = setup
    even = np.arange(cfg.vocab_size) % 2 == 0
    ref = first_token_distribution(params, cfg)
    kl, success = {}, {}
    for beta in (0.0, 1.0):
        pi = first_token_distribution(run_even_first_token_task(cfg, params, beta), cfg)
        kl[beta] = float(np.mean(np.sum(pi * np.log(pi / ref), axis=1)))
        success[beta] = float(np.mean(pi[:, even].sum(axis=1)))
    start = float(np.mean(ref[:, even].sum(axis=1)))
    print(f"even-token probability {start:.3f} -> {success}; KL to reference {kl}")
    assert success[0.0] > start + 0.2  # the task is learned without the KL term
    assert kl[1.0] < 0.5 * kl[0.0]
