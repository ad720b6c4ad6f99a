"""The shared-stop arm of the length-mechanism study (experiments/length_mechanism.py): the
policy conditions on a fixed SLOT token in place of the answer it gave, so its stop decision
cannot depend on the answer. The real tiny decoder, sampler and Learner, one GRPO step."""
import dataclasses

import jax
import numpy as np
import pytest

from jaxrl_llm.models import forward
from jaxrl_llm.reports import length_mechanism as lm


STUDY = dataclasses.replace(lm.MechanismStudy(), seeds=1, steps=1, max_tokens=8, arms="grpo,dr_grpo", sft_steps=30)


@pytest.fixture(scope="module")
def start():
    """A briefly supervised decoder and a GRPO learner."""
    from jaxrl_llm.train.config import TrainConfig
    from jaxrl_llm.train.learn.learner import Learner

    cfg, params = lm.supervised_start(3, STUDY)
    recipe = lm.study_recipes(STUDY)["grpo"]
    learner = Learner(cfg, recipe, TrainConfig(lr=1e-2, precision="fp32", micro_batch_size=32, grad_clip=1.0,
                                               pack=False), total_steps=1)
    return cfg, params, recipe, learner


def one_step(start, shared_stop: bool) -> dict:
    """One GRPO step of the arm from the fixture's start: run_recipe's log (step 0 and step 1)."""
    cfg, params, recipe, learner = start
    sample, eos_prob = lm._sampler(cfg, STUDY.max_tokens, shared_stop)
    return lm.run_recipe(learner, recipe, params, 0, STUDY, eos_prob, sample, shared_stop=shared_stop)


@pytest.mark.slow  # ~60 s at load 7 (compiles the sampler twice, the SFT step and the learner); make test-all
def test_shared_stop_policy_cannot_see_its_answer(start):
    cfg, params, _, _ = start
    log = one_step(start, shared_stop=True)
    # Exactly equal at the start and after a step: the free positions condition on SLOT either way.
    assert log["q_right"] == log["q_wrong"]
    assert len(log["q_right"]) == 2 and log["q_right"][1] != log["q_right"][0]  # the step moved the stop logit
    # Independently of the study's measurement: the decoder's own EOS probability after SLOT,
    # straight from models.forward, is what the arm measured at the start.
    slot = lm.eval_tokens(0, STUDY)[0].copy()
    slot[:, 1] = lm.SLOT
    logits, _ = forward(params, cfg, slot, attention_mask=np.ones_like(slot))
    eos = np.asarray(jax.nn.softmax(logits, axis=-1))[:, 1:-1, lm.EOS].mean()
    assert log["q_right"][0] == pytest.approx(float(eos), rel=1e-5)
    # What the learner trains on: the sampler writes SLOT where the task's answer goes.
    sample, _ = lm._sampler(cfg, STUDY.max_tokens, True)
    prompts = np.repeat(lm.PROMPT0 + np.arange(lm.NUM_PROMPTS), STUDY.samples).astype(np.int32)
    answers = np.resize([lm.RIGHT, lm.WRONG], prompts.size).astype(np.int32)
    tokens = np.asarray(sample(params, prompts, answers, jax.random.key(0)))
    assert (tokens[:, 1] == lm.SLOT).all() and (tokens[:, 0] == prompts).all()
    seen_tokens = np.asarray(lm._sampler(cfg, STUDY.max_tokens, False)[0](params, prompts, answers, jax.random.key(0)))
    np.testing.assert_array_equal(seen_tokens[:, 1], answers)
    # The rewards grade the task's answers: both classes occur in the step's batch, and the on-policy
    # stop probabilities of the two classes are close (same distribution), not equal (other samples).
    assert 0 < log["reward"][0] < 1 and np.isfinite(log["length_right"][0]) and np.isfinite(log["length_wrong"][0])
    assert log["q_own_right"][0] == pytest.approx(log["q_own_wrong"][0], abs=0.02)
    # The contrast, same start and step with the answer visible: the stop probabilities after RIGHT
    # and WRONG differ (slightly after 30 supervised steps) and the GRPO step moves them differently.
    seen = one_step(start, shared_stop=False)
    assert seen["q_right"][0] != seen["q_wrong"][0]
    moved = np.diff(seen["q_right"]) - np.diff(seen["q_wrong"])
    assert abs(moved[0]) > 1e-5


def test_policy_view_hides_the_answer_in_numpy_and_jax():
    tokens = np.array([[2, lm.RIGHT, 9, 1], [3, lm.WRONG, 10, 11]], np.int32)
    expected = np.array([[2, lm.SLOT, 9, 1], [3, lm.SLOT, 10, 11]], np.int32)
    np.testing.assert_array_equal(lm.policy_view(tokens, True), expected)
    np.testing.assert_array_equal(np.asarray(lm.policy_view(jax.numpy.asarray(tokens), True)), expected)
    np.testing.assert_array_equal(lm.policy_view(tokens, False), tokens)
