"""Multi-turn episodes on the real vLLM CPU server (SmolLM2, float32, token-id prompts):
the learner scores exactly the ids the server sampled, turn after turn, and its log-probs
of the policy's tokens equal the server's within the float32 tolerance of the single-turn
tests (tests/rollout/test_vllm_server.py)."""
import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from jaxrl_llm.train.policy import load_policy

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # ~45 s of test call under load, plus the shared server

FP32_ATOL = 2e-3  # float32 server vs float32 JAX decoder (as in test_vllm_server.py)


def test_vllm_multi_turn_policy_logprobs_equal_the_learners(vllm_server, smollm2, learner_logprobs):
    server = vllm_server.get()
    policy = load_policy("smollm2")
    task = make_task("guess_number", max_number=50)  # hard enough that most episodes need several turns
    examples = task.examples("train", 2, seed=0)
    engine = VLLMEngine(VLLMClient([server.url]))
    batch = run_episodes(engine, policy, task, examples, 2, SamplingParams(temperature=1.0, seed=3),
                         EpisodeLimits(max_turns=3, max_tokens=160, turn_max_tokens=12))
    records = batch.rollouts.records
    assert batch.metrics["episode_turns"] > 1.5, batch.metrics  # several turns, observations in between
    mu, pi = [], []
    full = learner_logprobs(smollm2.params, [np.concatenate([r.prompt_token_ids, r.completion_token_ids])
                                             for r in records], 1.0)
    multi = 0
    for r, logp in zip(records, full):
        mask = r.loss_mask.astype(bool)
        multi += not mask.all()
        learner = logp[len(r.prompt_token_ids) - 1:]
        assert learner.shape == mask.shape
        mu.append(r.sampler_logprobs[mask])
        pi.append(learner[mask])
        assert np.all(r.sampler_logprobs[~mask] == 0)
    assert multi >= 2  # episodes with observation tokens inside the sequence
    diff = np.abs(np.concatenate(mu) - np.concatenate(pi))
    print(f"\nmulti-turn vLLM vs learner: {diff.size} policy tokens, max |d logp| {diff.max():.2e}, "
          f"metrics {batch.metrics}")
    assert diff.max() < FP32_ATOL
