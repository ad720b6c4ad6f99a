"""The two built-in multi-turn environments and their tasks.

calculator_tool  a multi-digit arithmetic question; the model may call a calculator
                 (``<calc>12*34</calc>`` -> ``<result>408</result>``, evaluated by
                 data/safe_arithmetic.py, never by Python eval) before answering;
                 reward 1 for the right final answer (tool use as in Toolformer,
                 Schick et al. 2023, arXiv 2302.04761, learned here by RL).
guess_number     guess a secret number from 1 to N with higher/lower hints; reward 1
                 when guessed within the turn limit (a feedback game in the style of
                 GEM's games, Liu et al. 2025, arXiv 2510.01051).

Both are :class:`EnvTask` s: their examples have train/held-out splits by question, like
every task, and each episode gets a fresh environment.
"""
from __future__ import annotations

import random
import re
from typing import Iterator

from jaxrl_llm.data.environments import EnvTask, StepResult
from jaxrl_llm.data.records import Example, check_heldout_fraction, check_split, split_of
from jaxrl_llm.data.safe_arithmetic import CalculatorError, format_number, safe_eval
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, GeneratedTask

_CALL = re.compile(r"<calc>(.*?)(?:</calc>|$)", re.DOTALL)
# One bounded separator class: adjacent optional runs (\s* [:=]? \s* \** \s*) backtrack
# polynomially on long runs of spaces in model text.
_ANSWER = re.compile(r"answer[\s:=*]{0,16}(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def _as_number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def final_answer(text: str) -> float | None:
    """The number after "Answer:" (the last one), else the last number of the text, else None."""
    answers = _ANSWER.findall(text)
    if answers:
        return _as_number(answers[-1])
    numbers = _NUMBER.findall(text)
    return _as_number(numbers[-1]) if numbers else None


class CalculatorEnv:
    """One arithmetic question; each turn is either a calculator call or the final answer.

    A turn holding ``<calc>EXPR</calc>`` (and no "Answer:") is a tool call: the first call
    is evaluated and the observation is ``<result>VALUE</result>`` (or ``<error>why</error>``,
    counted as a tool error). Any other turn is the final answer ("Answer: N", else the
    last number in it): the episode terminates with reward 1 if it equals the answer.
    """

    def __init__(self):
        self.answer: float | None = None

    def reset(self, example: Example) -> tuple[str, dict]:
        self.answer = float(example.answer)
        return example.prompt, {}

    def step(self, action_text: str) -> StepResult:
        call = _CALL.search(action_text)
        if call is not None and not _ANSWER.search(action_text):
            try:
                return StepResult(f"<result>{format_number(safe_eval(call.group(1)))}</result>", 0.0, False,
                                  info={"tool_call": True, "tool_error": False})
            except CalculatorError as err:
                return StepResult(f"<error>{err}</error>", 0.0, False, info={"tool_call": True, "tool_error": True})
        given = final_answer(action_text)
        correct = given is not None and abs(given - self.answer) < 1e-9
        return StepResult("", 1.0 if correct else 0.0, True, info={"answer": given})


class CalculatorTask(GeneratedTask, EnvTask):
    """``What is a OP b?`` with ``digits``-digit operands and OP in ``ops``, played in a CalculatorEnv."""

    name = "calculator_tool"

    def __init__(self, digits: int = 2, ops: str = "+-*", *, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        if not isinstance(digits, int) or isinstance(digits, bool) or digits < 1:
            raise ValueError(f"digits must be an int >= 1, got {digits!r}")
        if not ops or any(op not in _OPS for op in ops):
            raise ValueError(f"ops must be a non-empty string of {''.join(_OPS)}, got {ops!r}")
        self.digits, self.ops = digits, ops
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self.low, self.high = (0 if digits == 1 else 10 ** (digits - 1)), 10**digits - 1

    def example(self, a: int, op: str, b: int) -> Example:
        question = f"{a} {op} {b}"
        prompt = (f"What is {question}? You may use a calculator: write <calc>EXPRESSION</calc> (for example "
                  f"<calc>7 * 6</calc>) and you will get <result>VALUE</result>. When you know the result, "
                  f"reply with 'Answer: NUMBER'.")
        return Example(id=f"{self.name}/{question}", task=self.name, prompt=prompt, answer=str(_OPS[op](a, b)),
                       split=split_of(question, self.heldout_fraction),
                       metadata={"a": a, "b": b, "op": op, "digits": self.digits})

    def _stream(self, seed: int) -> Iterator[Example]:
        rng = random.Random(seed)
        while True:
            yield self.example(rng.randint(self.low, self.high), rng.choice(self.ops), rng.randint(self.low, self.high))

    def make_env(self) -> CalculatorEnv:
        return CalculatorEnv()


class GuessNumberEnv:
    """Guess a secret from 1 to N; each wrong guess gets "Higher." or "Lower." (the secret
    is higher/lower than the guess). A reply without a number is an invalid move (counted
    as a tool error) and costs the turn. Reward 1 when guessed; the turn limit is the
    rollout's (task.max_turns)."""

    def __init__(self, max_number: int = 10):
        self.max_number = max_number
        self.secret: int | None = None

    def reset(self, example: Example) -> tuple[str, dict]:
        self.secret = int(example.answer)
        return example.prompt, {}

    def step(self, action_text: str) -> StepResult:
        match = re.search(r"(?<!\d)-?\d{1,12}(?!\d)", action_text)  # bounded: int() of 5k digits raises
        if match is None:
            return StepResult(f"Please reply with one number from 1 to {self.max_number}.", 0.0, False,
                              info={"tool_error": True})
        guess = int(match.group())
        if guess == self.secret:
            return StepResult("", 1.0, True, info={"guess": guess})
        hint = "Higher." if self.secret > guess else "Lower."
        return StepResult(hint, 0.0, False, info={"guess": guess})


class GuessNumberTask(EnvTask):
    """Secrets 1..max_number, split by secret (a held-out secret is never trained on)."""

    name = "guess_number"

    def __init__(self, max_number: int = 10, *, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        if not isinstance(max_number, int) or isinstance(max_number, bool) or max_number < 2:
            raise ValueError(f"max_number must be an int >= 2, got {max_number!r}")
        self.max_number = max_number
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)

    def example(self, secret: int) -> Example:
        choices = ("one of " + ", ".join(map(str, range(1, self.max_number + 1))) if self.max_number <= 10
                   else f"a whole number from 1 to {self.max_number}")  # SmolLM2 guesses more often from a list
        prompt = (f"Let's play a guessing game. My secret number is {choices}. Guess it: reply with only "
                  f"the number. After a wrong guess I say 'Higher.' (my number is higher) or 'Lower.'.")
        key = f"guess {secret} of 1..{self.max_number}"
        return Example(id=f"{self.name}/{self.max_number}/{secret}", task=self.name, prompt=prompt,
                       answer=str(secret), split=split_of(key, self.heldout_fraction),
                       metadata={"secret": secret, "max_number": self.max_number})

    def all_examples(self, split: str) -> list[Example]:
        check_split(split)
        return [e for e in map(self.example, range(1, self.max_number + 1)) if e.split == split]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        pool = self.all_examples(split)
        if not pool or (unique and n > len(pool)):
            raise ValueError(f"task {self.name!r} has {len(pool)} {split} secrets, {n} "
                             f"{'distinct ' if unique else ''}requested")
        rng = random.Random(seed)
        return rng.sample(pool, n) if unique else [rng.choice(pool) for _ in range(n)]

    def make_env(self) -> GuessNumberEnv:
        return GuessNumberEnv(self.max_number)
