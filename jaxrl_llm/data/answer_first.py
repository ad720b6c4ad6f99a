"""A length-neutral task: the answer comes first and is graded alone; whatever follows
it until EOS is free.

Liu et al. 2025 (Dr. GRPO, arXiv 2503.20783) attribute the growth of wrong answers
under GRPO to its 1/|o_i| loss normalisation. On a task whose reward depends on the
length (e.g. "answer with just the number", where chatter is penalised by the format
check) the reward signal swamps that bias. Here the reward is a function of the
leading answer only (the bare sum, or the question's equation with its sum), so any length trend comes from the objective
(docs/objectives.md#length-drift-on-a-length-neutral-task).
"""
from __future__ import annotations

import re

from jaxrl_llm.data.records import Example
from jaxrl_llm.rewards import trusted_in_process

LEADING_INTEGER = re.compile(r"\s*(-?\d+)(?!\d|\.\d)")  # "12." counts, "12.5" does not
# "a + b = N", the question restated with its sum: SmolLM2-135M-Instruct opens its replies this
# way rather than with the bare number (at temperature 0.7, 9 of 32 step-0 replies began with
# the equation and the right sum, none with the bare sum; experiments/README.md, experiment 6).
LEADING_EQUATION = re.compile(r"\s*(-?\d+)\s*\+\s*(-?\d+)\s*=\s*(-?\d+)(?!\d|\.\d)")


def leading_answer(completion: str, a: int, b: int) -> int | None:
    """The answer a completion starts with: a leading integer, or the result of a leading
    equation "a + b = N" about this question's operands (either order). None otherwise.
    Only this prefix is read, so what follows it cannot change the grade."""
    equation = LEADING_EQUATION.match(completion)
    if equation is not None:
        operands = sorted((int(equation.group(1)), int(equation.group(2))))
        return int(equation.group(3)) if operands == sorted((a, b)) else None
    match = LEADING_INTEGER.match(completion)
    return int(match.group(1)) if match is not None else None


@trusted_in_process
def leading_integer_reward(completion: str, example) -> float:
    """1.0 if the completion starts (after whitespace) with the sum ``example.answer``,
    alone ("12. ...") or as the question's equation ("6 + 6 = 12 ..."); the text after
    it does not count. Else 0.0."""
    answer = leading_answer(completion, int(example.metadata["a"]), int(example.metadata["b"]))
    return float(answer is not None and answer == int(example.answer))


INSTRUCTION = "Start your reply with the number, then explain how you got it."


def answer_first_example(base: Example, task_name: str) -> Example:
    """An addition example re-asked in the answer-first format: same question (so the same
    hash split) and answer, the instruction above, `task_name` as its task."""
    a, b = base.metadata["a"], base.metadata["b"]
    return Example(id=f"{task_name}/{a}+{b}", task=task_name, prompt=f"What is {a} + {b}? {INSTRUCTION}",
                   answer=base.answer, split=base.split, metadata=base.metadata)
