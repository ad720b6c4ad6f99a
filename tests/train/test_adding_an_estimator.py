"""docs/architecture.md, "Adding an advantage estimator", followed by a test: a toy estimator
with one extra input from sampling, added only through the documented places (registered at run
time here instead of edited in):

1. the estimator, as in core/estimators.py: `inputs = ("prompt_lengths",)` and a keyword of
   that name;
2. its registry entry, as in core/recipe_overrides.py: `core.ADVANTAGES["prompt_length_baseline"]`,
   which makes `recipe.advantage=prompt_length_baseline` a valid config value;
3. the sampling side, as in train/sample/extras.py: `EXTRA_INPUTS["prompt_lengths"]`, a function
   of the step's grades and rollouts.

The toy: A_pg = r_pg - c * L_p, with L_p the token length of prompt p, a per-prompt [P] extra
(like ReMax's baseline). Checked against hand values through `core.prepare_step_batch` and
`core.mini_batch`, and through a real 2-step run of the RL loop (tiny model, JAX sampler) with
two mini-batches per step, so the extra is sliced by prompt.
"""
from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample import extras
from tests.train.tiny_run import tiny_config  # tiny_model_dir: a fixture of tests/train/conftest.py

COEF = 0.01


@dataclasses.dataclass(frozen=True)
class PromptLengthBaseline:
    """Toy estimator: A_pg = r_pg - coef * prompt_lengths[p], broadcast onto the response's tokens."""

    coef: float = COEF
    inputs: ClassVar[tuple[str, ...]] = ("prompt_lengths",)

    def __call__(self, rewards, mask, *, values=None, token_rewards=None, prompt_lengths=None):
        if prompt_lengths is None:
            raise ValueError("PromptLengthBaseline needs StepInputs.extras['prompt_lengths'] [P]")
        rewards = core.estimators.fold_sequence_rewards(rewards, token_rewards)
        advantages = rewards - self.coef * jnp.asarray(prompt_lengths, jnp.float32)[:, None]
        return core.TokenAdvantages(core.broadcast_to_tokens(advantages, mask), None)


def prompt_lengths(graded, rollouts) -> np.ndarray:
    """[P]: the token length of each prompt (its first sample's record)."""
    group = rollouts.samples_per_prompt
    return np.array([rollouts.records[p * group].prompt_token_ids.size for p in range(rollouts.num_prompts)],
                    np.float32)


@pytest.fixture
def registered(monkeypatch):
    """The toy estimator and its extra, registered as the documented files would hold them."""
    monkeypatch.setitem(core.ADVANTAGES, "prompt_length_baseline", PromptLengthBaseline())
    monkeypatch.setitem(extras.EXTRA_INPUTS, "prompt_lengths", prompt_lengths)


def test_prepare_step_batch_hands_the_toy_its_extra_per_prompt(registered):
    recipe = core.customize_recipe(core.get_recipe("grpo"), advantage="prompt_length_baseline")
    rewards = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], np.float32)
    inputs = core.StepInputs(rewards, mask, np.zeros((4, 3), np.float32),
                             extras={"prompt_lengths": np.array([20.0, 40.0], np.float32)})
    batch, metrics = core.prepare_step_batch(recipe, inputs)
    # by hand: A = r - 0.01 L_p = [[0.8, -0.2], [-0.4, 0.6]], on the valid tokens only
    want = np.array([[0.8, 0.8, 0], [-0.2, 0, 0], [-0.4, -0.4, -0.4], [0, 0, 0]])
    np.testing.assert_allclose(np.asarray(batch.advantages), want, atol=1e-6)
    np.testing.assert_allclose(float(metrics["advantage_token_mean"]), (1.6 - 0.2 - 1.2) / 6, atol=1e-6)
    second = core.mini_batch(inputs, 1, 2)  # prompt 1: its extra entry and its two rows
    np.testing.assert_array_equal(second.extras["prompt_lengths"], [40.0])
    np.testing.assert_array_equal(second.mask, mask[2:])
    batch, _ = core.prepare_step_batch(recipe, second)
    np.testing.assert_allclose(np.asarray(batch.advantages), want[2:], atol=1e-6)
    with pytest.raises(ValueError, match=r"extras \['prompt_lengths'\] given, but recipe 'grpo'"):
        core.prepare_step_batch(core.get_recipe("grpo"), inputs)
    with pytest.raises(ValueError, match=r"extras\['prompt_lengths'\] has leading axis 3; valid: P = 2"):
        core.mini_batch(inputs._replace(extras={"prompt_lengths": np.zeros(3, np.float32)}), 0, 2)


@pytest.mark.slow  # 40 s, make test-all since 2026-11-29 (make test time); prepare_step_batch's hand values stay
def test_the_loop_fills_the_toy_extra_and_the_learner_uses_it(tiny_model_dir, tmp_path, registered, monkeypatch):
    recorded, real_learn = [], loop.learn

    def learn(learner, state, rollouts, sampled, **kw):
        recorded.append((rollouts, sampled))
        return real_learn(learner, state, rollouts, sampled, **kw)

    monkeypatch.setattr(loop, "learn", learn)
    cfg = tiny_config(tiny_model_dir, tmp_path / "toy", "recipe.advantage=prompt_length_baseline", "total_steps=2",
                      "rollout.prompts_per_step=4", "train.minibatches_per_batch=2", "train.precision=fp32")
    loop.train(cfg)
    rows = read_metrics(cfg.run_path)
    assert [r["step"] for r in rows] == [1, 2]
    group = cfg.rollout.samples_per_prompt
    for (rollouts, sampled), row in zip(recorded, rows):
        # independent of the filler: the prompt lengths counted from the records here
        lengths = np.array([r.prompt_token_ids.size for r in rollouts.records], np.float64)[::group]
        np.testing.assert_array_equal(sampled.extras["prompt_lengths"], lengths)
        completion = np.array([r.num_completion_tokens for r in rollouts.records], np.float64)
        advantages = (np.asarray(sampled.rewards, np.float64) - COEF * lengths[:, None]).reshape(-1)
        rows_per_minibatch = 2 * group  # two prompts each; the step's metric is the mean over its mini-batches
        per_minibatch = [np.sum(completion[m] * advantages[m]) / np.sum(completion[m])
                         for m in (slice(0, rows_per_minibatch), slice(rows_per_minibatch, None))]
        assert row["advantage_token_mean"] == pytest.approx(np.mean(per_minibatch), rel=1e-5)
