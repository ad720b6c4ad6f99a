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
from jaxrl_llm.data.tasks import AdditionTask
from jaxrl_llm.rewards import trusted_in_process

LEADING_INTEGER = re.compile(r"\s*(-?\d+)(?!\d|\.\d)")  # "12." counts, "12.5" does not


@trusted_in_process
def leading_integer_reward(completion: str, example) -> float:
    """1.0 if the completion starts (after whitespace) with an integer equal to
    ``example.answer``; the text after it does not count. Else 0.0."""
    match = LEADING_INTEGER.match(completion)
    return float(match is not None and int(match.group(1)) == int(example.answer))


class AnswerFirstAdditionTask(AdditionTask):
    """``What is a + b? Start your reply with the number, then explain it in your own words.``

    The questions and held-out split are those of :class:`AdditionTask` (same question
    strings, so the same hash split); only the instruction and the grader differ."""

    name = "addition_answer_first"
    reward_fn = staticmethod(leading_integer_reward)
    instruction = "Start your reply with the number, then explain how you got it."

    def example(self, a: int, b: int) -> Example:
        base = super().example(a, b)
        return Example(id=f"{self.name}/{a}+{b}", task=self.name,
                       prompt=f"What is {a} + {b}? {self.instruction}", answer=base.answer, split=base.split,
                       metadata=base.metadata)
