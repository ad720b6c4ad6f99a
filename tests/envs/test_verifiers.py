"""verifiers environments (data/verifiers_envs.py) in the project's multi-turn loop: a SingleTurnEnv
and a MultiTurnEnv on the real JAX sampler (a random 2-layer decoder over SmolLM2's tokenizer and
chat template), a ToolEnv with a Python function tool played by a scripted policy. The environments
are the local ones of tests/envs/verifiers_local_envs.py (data sets of a few rows made there)."""
import asyncio
import contextlib
import re

import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.data.verifiers_envs import parse_tool_calls
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.sample.engines import engine_spec, make_engine
from jaxrl_llm.train.sample.episodes import EpisodeLimits, run_episodes
from tests.envs import verifiers_local_envs as local
from tests.envs.scripted_engine import FAKE_LOGPROB, FakeScriptedEngine
from tests.train.tiny_run import tiny_config

LOCAL = "tests.envs.verifiers_local_envs"


class RecordingEngine:
    """The real engine, with every generate() call's prompts and records kept (not a fake: it samples)."""

    def __init__(self, engine):
        self.engine, self.calls = engine, []

    @property
    def weight_version(self):
        return self.engine.weight_version

    def generate(self, prompts, n, params):
        out = self.engine.generate(prompts, n=n, params=params)
        self.calls.append(([list(p) for p in prompts], out.records))
        return out


@pytest.fixture(scope="module")
def jax_engine(tiny_model_dir, policy, tmp_path_factory):
    cfg = tiny_config(tiny_model_dir, tmp_path_factory.mktemp("run"))
    with contextlib.ExitStack() as stack:
        yield make_engine(engine_spec(cfg), policy, policy.params, stack=stack)


def text_of(policy, ids) -> str:
    return policy.tokenizer.decode([int(t) for t in ids if int(t) not in policy.eos_token_ids])


def rubric_score(task, example, text: str) -> float:
    """The environment's own rubric called directly on a state holding the reply."""
    import verifiers as vf

    row = task.row(example)
    state = vf.State(input={"prompt": row["prompt"], "answer": row["answer"], "info": {}, "example_id": 0})
    state.update(completion=[vf.AssistantMessage(content=text)], trajectory=[], reward=None, metrics=None)
    asyncio.run(task.env.rubric.score_rollout(state))
    return state["reward"]


def test_single_turn_env_rewards_are_the_rubrics_and_ids_are_the_samplers(policy, jax_engine):
    task = make_task("verifiers", env_id=f"{LOCAL}:load_reverse")
    examples = task.examples("train", 3, seed=1)
    engine = RecordingEngine(jax_engine)
    batch = run_episodes(engine, policy, task, examples, 2, SamplingParams(temperature=1.0, seed=3),
                         EpisodeLimits(max_turns=1, max_tokens=8, turn_max_tokens=8))
    [(prompts, sampled)] = engine.calls
    retokenized_differs = 0
    for i, (record, want) in enumerate(zip(batch.rollouts.records, sampled)):
        example = examples[i // 2]
        question = next(r["question"] for r in local.ROWS if r["answer"] == example.answer)
        hand_prompt = ("<|im_start|>system\nAnswer in one word.<|im_end|>\n<|im_start|>user\n"
                       f"{question}<|im_end|>\n<|im_start|>assistant\n")  # SmolLM2's ChatML, system + user
        assert policy.tokenizer.decode(record.prompt_token_ids.tolist(), skip_special_tokens=False) == hand_prompt
        np.testing.assert_array_equal(record.prompt_token_ids, prompts[i])
        # the learner's ids and log-probs are the sampler's, position for position
        np.testing.assert_array_equal(record.completion_token_ids, want.completion_token_ids)
        np.testing.assert_array_equal(record.sampler_logprobs, want.sampler_logprobs)
        assert record.loss_mask.all()
        text = text_of(policy, want.completion_token_ids)
        reward = float(batch.rewards.flat[i])
        assert reward == pytest.approx(local.reverse_reward_by_hand(text, example.answer), abs=1e-6)
        assert reward == pytest.approx(rubric_score(task, example, text), abs=1e-6)
        ids = [t for t in want.completion_token_ids.tolist() if t not in policy.eos_token_ids]
        retokenized_differs += policy.tokenizer.encode(text, add_special_tokens=False).ids != ids
    # random text does not survive decode -> encode: re-tokenizing the history would have changed the ids
    assert retokenized_differs > 0
    assert len(set(batch.rewards.flat)) > 1  # the rubric's scores differ between samples


def test_multi_turn_env_appends_the_samplers_ids_turn_by_turn(policy, jax_engine):
    task = make_task("verifiers", env_id=f"{LOCAL}:load_countdown")
    examples = task.examples("train", 2, seed=0)
    engine = RecordingEngine(jax_engine)
    batch = run_episodes(engine, policy, task, examples, 1, SamplingParams(temperature=1.0, seed=7),
                         EpisodeLimits(max_turns=3, max_tokens=64, turn_max_tokens=5))
    assert len(engine.calls) == 3
    np.testing.assert_array_equal(batch.rewards, np.ones((2, 1)))  # turns_played: 3 of 3
    for i, record in enumerate(batch.rollouts.records):
        want_ids, want_mask, want_logprobs = [], [], []
        for turn, (_, records) in enumerate(engine.calls):
            sampled = records[i]
            want_ids += sampled.completion_token_ids.tolist()
            want_mask += [1] * sampled.num_completion_tokens
            want_logprobs += sampled.sampler_logprobs.tolist()
            if turn < 2:
                closed = sampled.finish_reason == "stop"
                text = ("" if closed else "<|im_end|>") + \
                    f"\n<|im_start|>user\nAgain ({2 - turn} left).<|im_end|>\n<|im_start|>assistant\n"
                obs = policy.tokenizer.encode(text, add_special_tokens=False).ids
                want_ids += obs
                want_mask += [0] * len(obs)
                want_logprobs += [0.0] * len(obs)
        np.testing.assert_array_equal(record.completion_token_ids, want_ids)
        np.testing.assert_array_equal(record.loss_mask, want_mask)
        np.testing.assert_array_equal(record.sampler_logprobs, np.asarray(want_logprobs, np.float32))


def adder_script(wrong_on: str):
    """Call add with the question's numbers, then answer the tool's result (plus 1 when the
    question holds `wrong_on`)."""
    def script(history: str) -> str:
        a, b = map(int, re.findall(r"What is (\d+) \+ (\d+)\?", history)[-1])
        result = re.findall(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>", history, re.DOTALL)
        if not result:
            return f'Let me add.\n<tool_call>\n{{"name": "add", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'
        return str(int(result[-1]) + (wrong_on in history))
    return script


def test_tool_env_calls_the_python_tool_and_scores_the_answer(policy):
    task = make_task("verifiers", env_id=f"{LOCAL}:load_adder", heldout_fraction=0.0)
    examples = task.all_examples("train")
    engine = FakeScriptedEngine(policy, adder_script(wrong_on="120 + 5"))
    batch = run_episodes(engine, policy, task, examples, 1, SamplingParams(seed=0),
                         EpisodeLimits(max_turns=4, max_tokens=256, turn_max_tokens=64))
    want = [float(not e.prompt.startswith("What is 120 + 5")) for e in examples]  # the script is wrong on 120 + 5
    np.testing.assert_array_equal(batch.rewards[:, 0], want)
    assert batch.metrics["episode_turns"] == 2 and batch.metrics["episode_tool_calls"] == 1
    for record, example in zip(batch.rollouts.records, examples):
        a, b = map(int, re.findall(r"(\d+) \+ (\d+)", example.prompt)[0])
        prompt = policy.tokenizer.decode(record.prompt_token_ids.tolist(), skip_special_tokens=False)
        assert prompt.startswith("<|im_start|>system\n# Tools\n") and '"name": "add"' in prompt
        assert prompt.endswith(f"<|im_start|>user\n{example.prompt}<|im_end|>\n<|im_start|>assistant\n")
        mask = record.loss_mask
        observation = record.completion_token_ids[mask == 0]  # the tool's result, as the template's tool turn
        assert policy.tokenizer.decode(observation.tolist(), skip_special_tokens=False) == \
            f"\n<|im_start|>tool\n{a + b}<|im_end|>\n<|im_start|>assistant\n"
        np.testing.assert_array_equal(record.sampler_logprobs[mask == 1], FAKE_LOGPROB)


def test_parse_tool_calls_reads_hermes_blocks():
    turn = parse_tool_calls('Sure. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
                            '<tool_call>{"name": "add", "arguments": "{\\"a\\": 3}"}</tool_call> <tool_call>oops'
                            '</tool_call>')
    assert turn.calls == [("add", '{"a": 1, "b": 2}'), ("add", '{"a": 3}')]
    assert turn.content == "Sure.  <tool_call>oops</tool_call>"  # the text as written, unparsed blocks kept
    assert parse_tool_calls("42").calls == [] and parse_tool_calls("42").content == "42"


def test_splits_are_the_environments_data_set_split_by_prompt_hash():
    task = make_task("verifiers", env_id=f"{LOCAL}:load_reverse")
    train, heldout = task.all_examples("train"), task.all_examples("heldout")
    assert sorted(e.answer for e in train + heldout) == sorted(r["answer"] for r in local.ROWS)
    assert train and heldout and not {e.answer for e in train} & {e.answer for e in heldout}
    assert task.examples("train", 4, seed=5) == task.examples("train", 4, seed=5)
