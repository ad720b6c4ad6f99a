"""A length-neutral task: the answer comes first and is graded alone; whatever follows
it until EOS is free.

Liu et al. 2025 (Dr. GRPO, arXiv 2503.20783) attribute the growth of wrong answers
under GRPO to its 1/|o_i| loss normalisation. On a task whose reward depends on the
length (e.g. "answer with just the number", where chatter is penalised by the format
check) the reward signal swamps that bias. Here the reward is a function of the
leading integer only, so any length trend comes from the objective
(docs/objectives.md#length-drift-on-a-length-neutral-task).
"""
from __future__ import annotations

import re

from jaxrl_llm.data.records import Example
from jaxrl_llm.rewards import trusted_in_process

LEADING_INTEGER = re.compile(r"\s*(-?\d+)(?!\d|\.\d)")  # "12." counts, "12.5" does not


@trusted_in_process
def leading_integer_reward(completion: str, example) -> float:
    """1.0 if the completion starts (after whitespace) with an integer equal to
    ``example.answer``; the text after it does not count. Else 0.0."""
    match = LEADING_INTEGER.match(completion)
    return float(match is not None and int(match.group(1)) == int(example.answer))


INSTRUCTION = "Start your reply with the number, then explain how you got it."


def answer_first_example(base: Example, task_name: str) -> Example:
    """An addition example re-asked in the answer-first format: same question (so the same
    hash split) and answer, the instruction above, `task_name` as its task."""
    a, b = base.metadata["a"], base.metadata["b"]
    return Example(id=f"{task_name}/{a}+{b}", task=task_name, prompt=f"What is {a} + {b}? {INSTRUCTION}",
                   answer=base.answer, split=base.split, metadata=base.metadata)
