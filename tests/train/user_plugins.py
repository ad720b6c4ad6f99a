"""A user's own rewards and task, as a researcher would write them in their own module, for
tests/train/test_task_plugins.py. Module-level, so grader workers import them by name."""
from __future__ import annotations

import math
import os
import time

from jaxrl_llm.data import Example, Task, register_task
from jaxrl_llm.data.records import split_of


def worker_pid_reward(completion: str, example) -> float:
    """The process id of whoever grades: a worker's, not the caller's."""
    return float(os.getpid())


def misbehaving_reward(completion: str, example) -> float:
    """1.0 for "right"; raises on "boom", hangs on "hang", returns NaN on "nan", text on "text"."""
    if completion == "boom":
        raise RuntimeError("user reward exploded on purpose")
    if completion == "hang":
        time.sleep(3600)
    if completion == "nan":
        return math.nan
    if completion == "text":
        return "1.0"  # type: ignore[return-value]
    return float(completion == "right")


def answer_length_reward(completion: str, example) -> float:
    """1.0 when the completion is exactly as long as the reference answer (a non-standard grader)."""
    return float(len(completion) == len(example.answer))


def tenths_of_length_reward(completion: str, example) -> float:
    """len(completion) / 10: a graded reward that differs between a random model's answers."""
    return len(completion) / 10.0


def one_argument_reward(completion: str) -> float:
    return 1.0


lambda_reward = lambda completion, example: 1.0  # noqa: E731  (cannot travel to a worker by name)

NOT_CALLABLE = 3.0


@register_task("user_countdown")
class CountdownTask(Task):
    """"Count down from N": N from `start` down to 1; records the arguments it was built with."""

    reward_fn = staticmethod(answer_length_reward)

    def __init__(self, start: int = 3, *, word: str = "Count down from", heldout_fraction: float = 0.0):
        self.name = "user_countdown"
        self.start, self.word, self.heldout_fraction = start, word, heldout_fraction

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        numbers = [k for k in range(self.start, 0, -1) if split_of(str(k), self.heldout_fraction) == split]
        picked = [numbers[(seed + i) % len(numbers)] for i in range(n)]
        return [Example(id=f"countdown/{k}", task=self.name, prompt=f"{self.word} {k}.",
                        answer=" ".join(str(j) for j in range(k, 0, -1)), split=split) for k in picked]


def length_parity_reward(completion: str, example) -> float:
    """1.0 for a completion of an odd number of characters: a reward a random tiny model earns for
    about half its answers, so its groups have non-zero advantages."""
    return float(len(completion) % 2)
