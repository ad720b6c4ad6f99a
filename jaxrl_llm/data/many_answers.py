"""A task with many correct answers per question, for diversity methods (DARLING).

"Name a multiple of k between 1 and M. Answer with just the number." has floor(M / k)
correct answers (at least 10 for k <= 5, M >= 50), each a single integer, so the
"answer" partition of DARLING (Li et al. 2025, arXiv 2509.02534: equal extracted answers
form a class) separates them, and a policy can be right in many distinct ways or
collapse onto one. Questions: k in 2..5 and M in 50..99 (200 of them), split by hash.
"""
from __future__ import annotations

import random
from typing import Iterator

from jaxrl_llm.data.records import Example, split_of
from jaxrl_llm.rewards import extract_integer_answer, trusted_in_process

DIVISORS = (2, 3, 4, 5)
UPPER_BOUNDS = tuple(range(50, 100))


@trusted_in_process
def multiple_reward(completion: str, example) -> float:
    """1.0 when the completion's integer (`extract_integer_answer`) is a multiple of
    metadata["k"] in 1..metadata["upper"], else 0.0."""
    value = extract_integer_answer(completion)
    k, upper = example.metadata["k"], example.metadata["upper"]
    return float(value is not None and 1 <= value <= upper and value % k == 0)


def correct_answers(example) -> tuple[int, ...]:
    """Every correct answer of a `MultipleOfTask` example."""
    k, upper = example.metadata["k"], example.metadata["upper"]
    return tuple(range(k, upper + 1, k))


def multiple_of_example(task_name: str, k: int, upper: int, heldout_fraction: float) -> Example:
    question = f"multiple of {k} in 1..{upper}"
    return Example(id=f"{task_name}/{k}/{upper}", task=task_name,
                   prompt=f"Name a multiple of {k} between 1 and {upper}. Answer with just the number.",
                   answer=str(k),  # one reference answer of many (see `correct_answers`)
                   split=split_of(question, heldout_fraction), metadata={"k": k, "upper": upper})


def multiple_of_stream(task_name: str, seed: int, heldout_fraction: float) -> Iterator[Example]:
    rng = random.Random(seed)
    while True:
        yield multiple_of_example(task_name, rng.choice(DIVISORS), rng.choice(UPPER_BOUNDS), heldout_fraction)
