"""A GEM game (data/gem_envs.py) played by SmolLM2 on the real vLLM CPU server: the episodes run
turn by turn through the server (token-id prompts), GEM's rewards come back, and the learner's
log-probs of the policy's tokens equal the server's (the float32 tolerance of
tests/rollout/test_episodes_vllm.py). SmolLM2-135M-Instruct writes no \\boxed{N} guess at
temperature 1 (16 of 16 first replies on 2026-11-29), so its episodes end after one turn with
GEM's format-error reward; multi-turn episodes on the server are tests/rollout/test_episodes_vllm.py's."""
import re

import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FP32_ATOL = 2e-3  # float32 server vs float32 JAX decoder (as in test_vllm_server.py)


def test_gem_guess_the_number_on_the_vllm_server(vllm_server, smollm2, learner_logprobs):
    server = vllm_server.get()
    policy = load_policy("smollm2")
    task = make_task("gem", env_id="game:GuessTheNumber-v0-easy")
    examples = task.examples("train", 4, seed=0)
    engine = VLLMEngine(VLLMClient([server.url]))
    batch = run_episodes(engine, policy, task, examples, 4, SamplingParams(temperature=1.0, seed=5),
                         EpisodeLimits(max_turns=4, max_tokens=256, turn_max_tokens=24))
    records = batch.rollouts.records
    print(f"\nGEM GuessTheNumber-easy on vLLM: rewards {batch.rewards.ravel().tolist()}, metrics {batch.metrics}")
    assert len(records) == 16 and batch.metrics["episode_policy_tokens"] > 0
    full = learner_logprobs(smollm2.params, [np.concatenate([r.prompt_token_ids, r.completion_token_ids])
                                             for r in records], 1.0)
    mu, pi = [], []
    for r, logp in zip(records, full):
        mask = r.loss_mask.astype(bool)
        learner = logp[len(r.prompt_token_ids) - 1:]
        mu.append(r.sampler_logprobs[mask])
        pi.append(learner[mask])
        assert np.all(r.sampler_logprobs[~mask] == 0)
    assert np.abs(np.concatenate(mu) - np.concatenate(pi)).max() < FP32_ATOL
    for r, reward in zip(records, batch.rewards.ravel()):  # GEM's rule: a first reply without \boxed{N} is a
        first_turn = r.completion_token_ids[:int(np.argmin(r.loss_mask)) or None]  # format error, -0.1, the end
        if not re.search(r"\\boxed\{\d+\}", policy.tokenizer.decode(first_turn.tolist())):
            assert reward == pytest.approx(-0.1) and r.loss_mask.all()
