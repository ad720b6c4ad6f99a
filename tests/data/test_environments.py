"""The text-environment interface, the safe calculator and the two built-in environments,
played by scripted policies (no model): rewards, hints, tool results and the checks on
malformed environment outputs."""
import math
import time

import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.data.builtin_envs import CalculatorEnv, GuessNumberEnv, final_answer
from jaxrl_llm.data.environments import (EnvironmentOutputError, SingleTurnEnv, StepResult, checked_reset,
                                         checked_step)
from jaxrl_llm.data.records import Example
from jaxrl_llm.data.safe_arithmetic import CalculatorError, safe_eval
from jaxrl_llm.rewards import addition_reward


@pytest.mark.parametrize("text, value", [("12*34", 408), (" 7 + 8 * 2 ", 23), ("(3 + 4) * -2", -14),
                                         ("7 / 2", 3.5), ("17 // 5", 3), ("17 % 5", 2), ("2 ** 10", 1024),
                                         ("1.5 * 4", 6.0), ("2 ** -1", 0.5)])
def test_safe_eval_computes_arithmetic(text, value):
    assert safe_eval(text) == value  # the values by hand


@pytest.mark.parametrize("text, why", [
    ("__import__('os').system('echo hi')", "Call"),  # calls
    ("abs(-3)", "Call"),
    ("x + 1", "Name"),  # names
    ("(1).real", "Attribute"),  # attributes
    ("[1, 2][0]", "Subscript"),
    ("'a' * 3", "only numbers"),  # strings
    ("1 < 2", "Compare"),
    ("lambda: 1", "Lambda"),
    ("True + 1", "only numbers"),
    ("9 ** 999999", "exponent"),  # huge powers, refused before computing
    ("2 ** 10 ** 10", "exponent"),
    ("99999 ** 1000", "power too large"),
    ("10 ** 300 * 10 ** 300 * 10 ** 300 * 10 ** 300", "too large"),
    ("1 / 0", "division by zero"),
    ("1e308 * 10", "too large"),
    ("1e308 + 1e308", "finite"),
    ("1 + " * 120 + "1", "too long"),
    ("-" * 40 + "1", "nested"),
    ("import os", "not an arithmetic expression"),
])
def test_safe_eval_refuses_everything_but_bounded_arithmetic(text, why):
    start = time.perf_counter()
    with pytest.raises(CalculatorError, match=why):
        safe_eval(text)
    assert time.perf_counter() - start < 0.5  # bounded work: refused before any big computation


def test_calculator_env_scripted_episode():
    task = make_task("calculator_tool", digits=2, ops="*")
    example = task.examples("train", 1, seed=4)[0]
    a, b = example.metadata["a"], example.metadata["b"]
    env = task.make_env()
    observation, _ = checked_reset(env, example)
    assert observation == example.prompt and f"{a} * {b}" in observation
    call = checked_step(env, f"Let me compute. <calc>{a}*{b}</calc>")
    assert call == StepResult(f"<result>{a * b}</result>", 0.0, False, False, {"tool_call": True, "tool_error": False})
    bad = checked_step(env, "<calc>open('x')</calc>")
    assert bad.observation.startswith("<error>") and bad.info["tool_error"] and not bad.terminated
    done = checked_step(env, f"Answer: {a * b}")
    assert done.terminated and done.reward == 1.0
    wrong = CalculatorEnv()
    wrong.reset(example)
    assert checked_step(wrong, f"Answer: {a * b + 1}").reward == 0.0
    assert final_answer("so it is 12, no wait: Answer: 1,024.") == 1024.0
    assert final_answer("the sum is 40 and then 41") == 41.0 and final_answer("no idea") is None


def test_guess_number_env_binary_search_solves_within_log2_turns():
    task = make_task("guess_number", max_number=10)
    for example in task.all_examples("train") + task.all_examples("heldout"):
        env = task.make_env()
        checked_reset(env, example)
        low, high, turns = 1, 10, 0
        while True:
            guess = (low + high) // 2
            result = checked_step(env, f"My guess: {guess}")
            turns += 1
            if result.terminated:
                break
            assert result.observation in ("Higher.", "Lower.") and result.reward == 0.0
            low, high = (guess + 1, high) if result.observation == "Higher." else (low, guess - 1)
        assert result.reward == 1.0 and guess == int(example.answer)
        assert turns <= math.ceil(math.log2(11))
    invalid = GuessNumberEnv(10)
    invalid.reset(example)
    result = checked_step(invalid, "hmm, maybe blue?")
    assert not result.terminated and result.info["tool_error"] and "1 to 10" in result.observation


def test_guess_number_splits_are_disjoint_secrets():
    task = make_task("guess_number", max_number=20)
    train = {e.answer for e in task.all_examples("train")}
    heldout = {e.answer for e in task.all_examples("heldout")}
    assert train and heldout and not train & heldout and len(train | heldout) == 20
    assert {e.answer for e in task.examples("heldout", 30, seed=1)} <= heldout


def test_single_turn_env_is_the_one_step_case():
    example = make_task("addition").examples("train", 1, seed=0)[0]
    env = SingleTurnEnv(addition_reward)
    assert checked_reset(env, example) == (example.prompt, {})
    result = checked_step(env, example.answer)
    assert result.terminated and result.reward == 1.0 == addition_reward(example.answer, example)


class NaNRewardEnv:
    def reset(self, example):
        return "hello", {}

    def step(self, text):
        return StepResult("more", float("nan"), False)


class BytesObservationEnv:
    def reset(self, example):
        return b"hello", {}

    def step(self, text):
        return StepResult("x", 0.0, True)


class TupleStepEnv:
    def reset(self, example):
        return "hello", {}

    def step(self, text):
        return ("x", 0.0, True, False, {})


class StringRewardEnv(NaNRewardEnv):
    def step(self, text):
        return StepResult("x", "1", True)


class NonStrStepObservationEnv(NaNRewardEnv):
    def step(self, text):
        return StepResult(None, 1.0, True)


EXAMPLE = Example("e/1", "t", "q", "1", "train")


@pytest.mark.parametrize("env, call, message", [
    (NaNRewardEnv(), "step", "NaNRewardEnv.step returned reward nan"),
    (StringRewardEnv(), "step", "StringRewardEnv.step returned reward '1'"),
    (BytesObservationEnv(), "reset", "BytesObservationEnv.reset returned observation b'hello'"),
    (NonStrStepObservationEnv(), "step", "NonStrStepObservationEnv.step returned observation None"),
    (TupleStepEnv(), "step", "TupleStepEnv.step returned tuple"),
])
def test_malformed_env_outputs_raise_naming_the_environment(env, call, message):
    with pytest.raises(EnvironmentOutputError, match=message):
        checked_reset(env, EXAMPLE) if call == "reset" else checked_step(env, "text")


def test_model_text_cannot_stall_or_crash_the_envs():
    """Adversarial replies: a long run of spaces after "Answer" is matched in linear time (a
    regex with adjacent optional runs took 2.8 s at 800 spaces), and a guess of 6000 digits is
    an invalid move, not int()'s digit-limit ValueError."""
    started = time.perf_counter()
    assert final_answer("Answer" + " " * 1500 + "x") is None
    assert final_answer("Answer: **408**") == 408 and final_answer("answer = -12") == -12
    assert time.perf_counter() - started < 0.5
    env = GuessNumberEnv(10)
    env.reset(Example("g", "guess_number", "Guess.", "7", "train"))
    assert env.step("9" * 6000).info == {"tool_error": True}
    assert env.step("my guess: 7").reward == 1.0
