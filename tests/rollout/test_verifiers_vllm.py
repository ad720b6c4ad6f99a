"""verifiers environments (data/verifiers_envs.py) played by SmolLM2 on the real vLLM CPU server (issue 62,
deliverable 4): a SingleTurnEnv on a local data set and a ToolEnv with a Python function tool, the local
environments of tests/envs/verifiers_local_envs.py. The rewards are the rubrics worked by hand on the
decoded replies, and the learner's log-probs of the policy's tokens equal the server's (the float32
tolerance of tests/rollout/test_episodes_vllm.py): the ids trained on are the ids the server sampled,
not a re-tokenization. tests/envs/test_verifiers.py plays the same environments on the JAX sampler and,
for the ToolEnv, a scripted policy that always calls the tool."""
import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from tests.envs import verifiers_local_envs as local

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

FP32_ATOL = 2e-3  # float32 server vs float32 JAX decoder (as in test_vllm_server.py)
LOCAL = "tests.envs.verifiers_local_envs"


def played(env: str, vllm_server, examples: int, samples: int, limits: EpisodeLimits, **kwargs):
    """(policy, task, examples, batch): `samples` episodes of each of the first `examples` train examples."""
    policy = load_policy("smollm2")
    task = make_task("verifiers", env_id=f"{LOCAL}:{env}", **kwargs)
    chosen = task.examples("train", examples, seed=0, unique=True)
    engine = VLLMEngine(VLLMClient([vllm_server.get().url]))
    batch = run_episodes(engine, policy, task, chosen, samples, SamplingParams(temperature=1.0, seed=11), limits)
    return policy, task, chosen, batch


def assert_logprobs_are_the_servers(records, smollm2, learner_logprobs) -> None:
    full = learner_logprobs(smollm2.params, [np.concatenate([r.prompt_token_ids, r.completion_token_ids])
                                             for r in records], 1.0)
    mu, pi = [], []
    for r, logp in zip(records, full):
        mask = r.loss_mask.astype(bool)
        mu.append(r.sampler_logprobs[mask])
        pi.append(logp[len(r.prompt_token_ids) - 1:][mask])
        assert np.all(r.sampler_logprobs[~mask] == 0)
    assert np.abs(np.concatenate(mu) - np.concatenate(pi)).max() < FP32_ATOL


def last_reply(policy, record) -> str:
    """The text of the policy's last turn: its tokens after the last observation, EOS dropped."""
    mask = record.loss_mask
    start = len(mask) - int(np.argmin(mask[::-1])) if not mask.all() else 0
    ids = [int(t) for t in record.completion_token_ids[start:] if int(t) not in policy.eos_token_ids]
    return policy.tokenizer.decode(ids)


def test_single_turn_env_on_the_vllm_server(vllm_server, smollm2, learner_logprobs):
    policy, task, examples, batch = played("load_reverse", vllm_server, 3, 4,
                                           EpisodeLimits(max_turns=1, max_tokens=24, turn_max_tokens=24))
    records = batch.rollouts.records
    assert len(records) == 12 and all(r.loss_mask.all() for r in records)
    for i, r in enumerate(records):
        text = last_reply(policy, r)
        assert batch.rewards.flat[i] == pytest.approx(local.reverse_reward_by_hand(text, examples[i // 4].answer),
                                                      abs=1e-6), text
    assert_logprobs_are_the_servers(records, smollm2, learner_logprobs)


def test_tool_env_on_the_vllm_server(vllm_server, smollm2, learner_logprobs):
    policy, task, examples, batch = played("load_adder", vllm_server, 4, 4,
                                           EpisodeLimits(max_turns=3, max_tokens=320, turn_max_tokens=48),
                                           heldout_fraction=0.0)
    records = batch.rollouts.records
    print(f"\nToolEnv on vLLM: rewards {batch.rewards.ravel().tolist()}, metrics {batch.metrics}")
    assert len(records) == 16
    answered = 0
    for i, r in enumerate(records):  # the rubric's exact_answer on a last reply that calls no tool
        text = last_reply(policy, r)
        if "<tool_call>" not in text:
            answered += 1
            assert batch.rewards.flat[i] == float(text.strip() == examples[i // 4].answer), text
    assert answered > 0
    assert_logprobs_are_the_servers(records, smollm2, learner_logprobs)
