"""VinePPO run from a config (recipe.name=vineppo) through the RL loop with the real JAX
sampler on the tiny learning setup.

Closed form: the task scores a completion 1 when its text starts with a space. That is
decided by the response's first token alone (its first byte is a space or not), so
  * V(prefix) of every prefix holding >= 1 response token is exactly 0 or 1, the score of
    the response's own first token, whatever the continuations are;
  * V(prompt) = sum of pi(token | prompt) over the tokens whose text starts with a space,
    computed exactly from one forward pass of the initial weights (the weights that draw
    step 1's responses and continuations).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.models import forward
from jaxrl_llm.rewards import trusted_in_process
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.sample import vineppo_step
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.policy import encode_prompts
from jaxrl_llm.train.sample.prompts import step_examples
from tests.train.learning_setup import SpacesTask, learning_config

K = 64
CHUNK = 3


@trusted_in_process
def starts_with_space(completion: str, example) -> float:
    return float(completion.startswith(" "))


class LeadingSpaceTask(SpacesTask):
    name = "leading_space"


@dataclasses.dataclass
class Recorded:
    estimates: list
    learn_advantages: list
    generate_calls: list  # per call: number of prompts
    result: object
    rewards: list


@pytest.fixture(scope="module")
def vine_run(learning_model_dir, learning_policy, tmp_path_factory):
    """One step of recipe.name=vineppo; every estimate, learner input and engine call recorded."""
    import contextlib

    from jaxrl_llm.train.sample.engines import engine_spec, host_params, make_engine

    mp = pytest.MonkeyPatch()
    rec = Recorded([], [], [], None, [])
    real_estimate, real_learn = vineppo_step.estimate, loop.learn

    def estimate(engine, rollouts, rewards, examples, **kw):
        out = real_estimate(engine, rollouts, rewards, examples, **kw)
        rec.estimates.append((rollouts, np.asarray(rewards), out))
        return out

    def learn(learner, state, rollouts, sampled, **kw):
        rec.learn_advantages.append(sampled.extras["advantages"])
        rec.rewards.append(np.asarray(sampled.rewards))
        return real_learn(learner, state, rollouts, sampled, **kw)

    mp.setattr(vineppo_step, "estimate", estimate)
    mp.setattr(loop, "learn", learn)
    cfg = learning_config(learning_model_dir, tmp_path_factory.mktemp("vine") / "run", "recipe.name=vineppo",
                          "total_steps=1", "rollout.samples_per_prompt=4", "train.micro_batch_size=8",
                          f"vineppo.k={K}", f"vineppo.chunk_tokens={CHUNK}")
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), learning_policy, host_params(learning_policy.params), stack=stack)
        real_generate = engine.generate

        def counted(prompts, n, params):  # the real engine's generate, counted (same signature)
            rec.generate_calls.append(len(prompts))
            return real_generate(prompts, n, params)

        engine.generate = counted
        rec.result = loop.train(cfg, task=LeadingSpaceTask(starts_with_space), policy=learning_policy, engine=engine)
    mp.undo()
    rec.cfg = cfg
    return rec


def _space_probability(policy, prompt_ids) -> float:
    """Closed form V(prompt): pi(first token's text starts with a space | prompt)."""
    texts = policy.tokenizer.decode_batch([[i] for i in range(policy.cfg.vocab_size)])
    space = np.array([t.startswith(" ") for t in texts])
    logits, _ = forward(policy.params, policy.cfg, jnp.asarray([prompt_ids]))
    return float(np.asarray(jax.nn.softmax(logits[0, -1].astype(jnp.float32)))[space].sum())


def test_in_loop_values_equal_the_closed_form(vine_run, learning_policy):
    rollouts, rewards, est = vine_run.estimates[0]
    group = rollouts.samples_per_prompt
    lengths = np.array([r.num_completion_tokens for r in rollouts.records])
    # prefixes with >= 1 response token: exactly the score of the response's own first token
    later = est.starts.copy()
    later[:, 0] = False
    first_token_scores = np.broadcast_to(rewards.reshape(-1, 1), est.starts.shape)
    np.testing.assert_array_equal(est.start_values[later], first_token_scores[later])
    assert later.sum() > 0 and np.all(est.starts[:, ::CHUNK][lengths[:, None] > np.arange(0, 6, CHUNK)])
    # V(prompt): one estimate per prompt (shared by its G responses) within 4 sigma of the closed form
    cfg = vine_run.cfg
    examples = step_examples(LeadingSpaceTask(), 1, seed=cfg.seed, prompts=cfg.rollout.prompts_per_step)
    prompts = encode_prompts(learning_policy, examples)
    for p, ids in enumerate(prompts):
        exact = _space_probability(learning_policy, ids)
        values = est.start_values[p * group:(p + 1) * group, 0]
        assert np.all(values == values[0])
        sigma = max(np.sqrt(exact * (1 - exact) / K), 1e-3)
        print(f"prompt {p}: V MC {values[0]:.3f} vs closed form {exact:.3f} (sigma {sigma:.3f})")
        assert abs(values[0] - exact) < 4 * sigma


def test_chunk_advantages_telescope_and_reach_the_learner(vine_run):
    rollouts, rewards, est = vine_run.estimates[0]
    lengths = np.array([r.num_completion_tokens for r in rollouts.records])
    mask = np.arange(est.advantages.shape[1])[None] < lengths[:, None]
    per_response = (est.advantages * est.starts).sum(axis=1)  # one advantage per chunk
    np.testing.assert_allclose(per_response, rewards.reshape(-1) - est.start_values[:, 0], atol=1e-6)
    for i in range(len(lengths)):  # each token carries its chunk's advantage
        chunk = np.cumsum(est.starts[i]) - 1
        starts = np.flatnonzero(est.starts[i])
        np.testing.assert_array_equal(est.advantages[i, :lengths[i]], est.advantages[i, starts[chunk[:lengths[i]]]])
    assert np.all(est.advantages[~mask] == 0)
    np.testing.assert_array_equal(vine_run.learn_advantages[0], est.advantages)  # the loop hands them over
    # and the learner's step batch holds them: its token-mean advantage metric
    metrics = vine_run.result.metrics
    assert metrics["advantage_token_mean"] == pytest.approx(est.advantages[mask].mean(), abs=1e-6)


def test_one_engine_call_for_all_continuations(vine_run):
    rollouts, _, est = vine_run.estimates[0]
    metrics = vine_run.result.metrics
    prompts = rollouts.num_prompts
    # step 1: the rollouts' call, then ONE call for every prefix (then the final eval, if any)
    assert vine_run.generate_calls[:2] == [prompts, int(metrics["vineppo_prefixes"])]
    n_unique = prompts + len({(i // rollouts.samples_per_prompt, tuple(rollouts.records[i].completion_token_ids[:t]))
                              for i, t in zip(*np.nonzero(est.starts)) if t > 0})
    assert metrics["vineppo_prefixes"] == n_unique
    assert metrics["vineppo_extra_tokens"] > 0 and metrics["vineppo_seconds"] > 0
    assert metrics["vineppo_extra_tokens"] <= n_unique * K * vine_run.cfg.rollout.max_tokens


@pytest.mark.parametrize("override,field", [
    ("rollout.max_lag=1", "rollout.max_lag"), ("shaping.darling=answer", "shaping.darling"),
    ("recipe.overlong_buffer=2", "recipe.overlong_buffer"), ("rollout.dynamic_sampling=true", "rollout.dynamic_sampling"),
    ("vineppo.k=0", "vineppo.k"), ("vineppo.chunk_tokens=0", "vineppo.chunk_tokens"),
    ("vineppo.chunk=lines", "vineppo.chunk"), ("task.name=guess_number", "task.name"),
])
def test_config_refuses_what_vineppo_cannot_run(override, field, tmp_path):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        learning_config("smollm2", tmp_path, "recipe.name=vineppo", "recipe.kl_beta=0.1", override)


def test_config_refuses_kl_as_reward_with_vineppo(tmp_path):
    with pytest.raises(ConfigError, match=r"recipe\.kl_mode"):
        learning_config("smollm2", tmp_path, "recipe.name=grpo", "recipe.advantage=vineppo", "recipe.kl_beta=0.1",
                        "recipe.kl_mode=reward")
    cfg = learning_config("smollm2", tmp_path, "recipe.name=grpo", "recipe.advantage=vineppo",
                          "vineppo.chunk=newline")
    assert cfg.vineppo.chunk == "newline"
    with pytest.raises(ConfigError, match=r"recipe.name = 'ppo' trains a critic"):
        learning_config("smollm2", tmp_path, "recipe.name=ppo", "recipe.advantage=vineppo")


def test_train_refuses_vineppo_on_an_environment_built_by_a_factory_function(tmp_path):
    """A task factory *function* returning an EnvTask passes the config's class-based check;
    train() checks the task it built, before any model loads."""
    from jaxrl_llm.data import make_task
    from jaxrl_llm.train.run import loop

    cfg = learning_config("smollm2", tmp_path, "recipe.name=vineppo")
    with pytest.raises(ConfigError, match="multi-turn environment.*vineppo"):
        loop.train(cfg, task=make_task("guess_number"))


@pytest.mark.slow
def test_a_short_vineppo_run_raises_heldout_pass_at_1(learning_model_dir, learning_policy, tmp_path):
    """recipe.name=vineppo on the tiny learning setup: held-out pass@1 (share of spaces >= 0.5)
    before and after 6 steps, same engine, same evaluation seed."""
    import contextlib

    from jaxrl_llm.rewards import GraderPool
    from jaxrl_llm.train.sample.engines import engine_spec, host_params, make_engine
    from jaxrl_llm.train.run.evaluation import evaluate, held_out

    cfg = learning_config(learning_model_dir, tmp_path / "run", "recipe.name=vineppo", "total_steps=6",
                          "vineppo.k=4", "vineppo.chunk_tokens=2", "task.eval_size=16", "task.eval_samples=4")
    task = SpacesTask()
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), learning_policy, host_params(learning_policy.params), stack=stack)
        pool = stack.enter_context(GraderPool(num_workers=1, timeout_s=10.0))
        before = evaluate(engine, learning_policy, task, held_out(cfg), samples=4, seed=123, pool=pool)
        out = loop.train(cfg, task=task, policy=learning_policy, engine=engine)
        after = evaluate(engine, learning_policy, task, held_out(cfg), samples=4, seed=123, pool=pool)
    print(f"held-out pass@1 {before['pass@1']:.3f} -> {after['pass@1']:.3f}; last step {out.metrics['reward']:.3f}")
    assert out.metrics["vineppo_extra_tokens"] > 0
    assert after["pass@1"] >= before["pass@1"] + 0.2
