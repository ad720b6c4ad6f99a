"""The PPO critic (value head on the trunk) against independent computations: values
equal hidden . w + b from a separate forward, the critic learns known per-prompt success
probabilities through the real `learn` step, warm-up holds the policy, and the sharded
and LoRA learners run it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import forward, make_mesh
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.config import config_from_dict
from jaxrl_llm.train.config.recipe import recipe_from_config
from jaxrl_llm.train.learn.critic import CriticState
from jaxrl_llm.train.learn.step import learn
from jaxrl_llm.train.learn.learner import Learner
from tests.models.hf_reference import hf_model, our_config_and_params

TEMPERATURE = 1.0
PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8], [70, 12], [33]]
SUCCESS = np.array([0.05, 0.95, 0.1, 0.9])  # per-prompt probability of reward 1, whatever the completion
G = 16
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def model():
    return our_config_and_params(hf_model("llama_tied", seed=5))


def ppo_config(**over):
    return config_from_dict({
        "recipe": {"name": "ppo"}, "rollout": {"prompts_per_step": len(PROMPTS), "samples_per_prompt": G,
                                               "max_tokens": MAX_TOKENS, "temperature": TEMPERATURE},
        "train": {"precision": "fp32", "lr": 1e-3, "micro_batch_size": 16, "epochs_per_batch": 2,
                  "minibatches_per_batch": 2, **over.pop("train", {})},
        "critic": {"lr": 1e-2, **over.pop("critic", {})}, **over})


def make_learner(cfg, model_cfg, mesh=None):
    return Learner(model_cfg, recipe_from_config(cfg), cfg.train, total_steps=cfg.total_steps,
                   temperature=TEMPERATURE, mesh=mesh, critic_cfg=cfg.critic)


def rollout(model_cfg, params, seed):
    rollouts = JaxSampler(model_cfg, params, eos_token_ids=[96]).generate(
        PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=seed))
    rewards = (np.random.default_rng(seed).random((len(PROMPTS), G)) < SUCCESS[:, None]).astype(np.float32)
    return rollouts, rewards


def test_values_are_the_head_on_a_separate_forwards_hidden_states(model):
    model_cfg, params = model
    learner = make_learner(ppo_config(), model_cfg)
    learner.init(params)
    rng = np.random.default_rng(1)
    critic = CriticState({"w": jnp.asarray(rng.standard_normal(model_cfg.hidden_size), jnp.float32),
                          "b": jnp.float32(0.3)}, None)
    rollouts, _ = rollout(model_cfg, params, seed=0)
    seq = build_sequences(rollouts, completion_width=MAX_TOKENS, prompt_bucket=8)
    values = np.asarray(learner.step_logprobs(params, seq, critic=critic).values)
    hidden, _ = forward(params, model_cfg, jnp.asarray(seq.tokens), positions=jnp.asarray(seq.positions),
                        attention_mask=jnp.asarray(seq.attention_mask), return_hidden=True)
    w = seq.prompt_width
    expected = np.asarray(hidden[:, w - 1:w - 1 + MAX_TOKENS]) @ np.asarray(critic.params["w"]) + 0.3
    mask = seq.completion_mask > 0
    np.testing.assert_allclose(values[mask], expected[mask], atol=1e-4)


def test_critic_learns_per_prompt_success_rates_and_warmup_holds_the_policy(model):
    """Rewards are Bernoulli(p_i) whatever the completion, so V at the first response token
    should approach p_i; explained variance is bounded by Var(p) / Var(R) = 0.73 here."""
    model_cfg, params = model
    cfg = ppo_config(critic={"warmup_steps": 1000})  # the critic alone learns (policy held)
    learner = make_learner(cfg, model_cfg)
    state = learner.init(params)
    for step in range(25):
        rollouts, rewards = rollout(model_cfg, params, seed=step)
        state, metrics = learn(learner, state, rollouts, core.StepInputs(rewards), completion_width=MAX_TOKENS)
    assert metrics["policy_held"] == 1.0
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(params)))
    seq = build_sequences(rollout(model_cfg, params, seed=99)[0], completion_width=MAX_TOKENS, prompt_bucket=8)
    first = np.asarray(learner.step_logprobs(state.params, seq, critic=state.critic).values)[:, 0]
    per_prompt = first.reshape(len(PROMPTS), G).mean(axis=1)
    error = np.abs(per_prompt - SUCCESS)
    print(f"V(first response token) {np.round(per_prompt, 3)} vs p {SUCCESS}: max error {error.max():.3f}; "
          f"explained variance {metrics['explained_variance']:.3f}")
    assert error.max() < 0.15  # Bernoulli noise: a batch mean of G=16 samples has std up to 0.075
    assert metrics["explained_variance"] > 0.5
    assert {"value_loss", "value_mean", "return_mean", "critic_grad_norm"} <= set(metrics)


def test_after_warmup_the_policy_moves_too(model):
    model_cfg, params = model
    cfg = ppo_config(critic={"warmup_steps": 2}, train={"epochs_per_batch": 1, "minibatches_per_batch": 1,
                                                         "micro_batch_size": 64})
    learner = make_learner(cfg, model_cfg)
    state = learner.init(params)
    held = []
    for step in range(3):
        rollouts, rewards = rollout(model_cfg, params, seed=step)
        before = state.params
        state, metrics = learn(learner, state, rollouts, core.StepInputs(rewards), completion_width=MAX_TOKENS)
        held.append(all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(before))))
    assert held == [True, True, False]


@pytest.mark.parametrize("variant", ["sharded", pytest.param("lora", marks=pytest.mark.slow)])  # lora: 14 s, make test-all since 2026-11-29 (make test time)
def test_sharded_and_lora_learners_train_the_critic(model, variant):
    model_cfg, params = model
    one_step = {"epochs_per_batch": 1, "minibatches_per_batch": 1}  # one update: both see the same hidden states
    cfg = ppo_config(train={**one_step, **({"lora_rank": 2} if variant == "lora" else {})})
    single = make_learner(ppo_config(train=one_step), model_cfg)
    other = make_learner(cfg, model_cfg, mesh=make_mesh(data=2, fsdp=4) if variant == "sharded" else None)
    rollouts, rewards = rollout(model_cfg, params, seed=0)
    a, _ = learn(single, single.init(params), rollouts, core.StepInputs(rewards), completion_width=MAX_TOKENS)
    b, metrics = learn(other, other.init(params), rollouts, core.StepInputs(rewards), completion_width=MAX_TOKENS)
    assert np.max(np.abs(np.asarray(b.critic.params["w"]))) > 0  # the head learned
    if variant == "sharded":  # the same update on 8 devices
        np.testing.assert_allclose(np.asarray(b.critic.params["w"]), np.asarray(a.critic.params["w"]), atol=1e-5)
    else:  # LoRA: zero-init adapters give the same first values; the critic head trains the same way
        np.testing.assert_allclose(np.asarray(b.critic.params["w"]), np.asarray(a.critic.params["w"]), atol=1e-4)
