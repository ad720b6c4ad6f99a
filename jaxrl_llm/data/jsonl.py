"""User data sets as JSONL: one JSON object per line, MATH-style.

Each non-blank line is an object with

  the question:  "prompt" or "problem" (a non-empty string; exactly one of them)
  the answer:    "answer" (a string or a number), or else "solution" (a string
                 whose last \\boxed{...} is the answer, as in MATH). When both
                 are present "answer" wins and "solution" is kept in metadata.
  optionally:    "id" (string or integer, unique in the file); every other
                 field goes to metadata unchanged.

    {"problem": "What is 1/2 + 1/4?", "answer": "\\\\frac{3}{4}"}
    {"prompt": "Compute 6 * 7.", "answer": 42, "id": "mul-1"}
    {"problem": "Half of 3?", "solution": "Half of 3 is $\\\\boxed{\\\\frac{3}{2}}$."}

Any problem is reported as :class:`DatasetFormatError` naming the file and
line. Graded by :func:`jaxrl_llm.rewards.math_verify_reward`.
"""
from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from jaxrl_llm.data.records import (
    Example,
    check_heldout_fraction,
    check_split,
    split_of,
)
from jaxrl_llm.data.registry import register_task
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, Task
from jaxrl_llm.rewards import extract_last_boxed, math_verify_reward

# Appended to each prompt by default: the grader reads the last \boxed{}.
BOXED_INSTRUCTION = "\n\nPut your final answer within \\boxed{}."

EXAMPLES_DIR = Path(__file__).parent / "examples"

_QUESTION_FIELDS = ("prompt", "problem")


class DatasetFormatError(ValueError):
    """A data set file that does not follow the JSONL prompt/answer format."""

    def __init__(self, path: str | os.PathLike, line: int, problem: str):
        super().__init__(f"{path}:{line}: {problem}")
        self.path = str(path)
        self.line = line


def load_jsonl(
    path: str | os.PathLike,
    *,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    instruction: str = BOXED_INSTRUCTION,
    task: str | None = None,
) -> list[Example]:
    """All examples of a JSONL file, in file order, each with its split.

    prompt = question + ``instruction``; the split is decided by the
    question text alone (records.split_of). ``task`` names the examples'
    task (default "jsonl:<file stem>"); ids are "<stem>/<id>" or
    "<stem>/line<N>".
    """
    heldout_fraction = check_heldout_fraction(heldout_fraction)
    path = Path(path)
    task = task or f"jsonl:{path.stem}"
    examples: list[Example] = []
    first_line_of_id: dict[str, int] = {}
    with open(path, encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            record = _parse_line(path, line_number, line)
            question, answer, local_id, metadata = _fields(path, line_number, record)
            example_id = f"{path.stem}/{local_id if local_id is not None else f'line{line_number}'}"
            if example_id in first_line_of_id:
                raise DatasetFormatError(
                    path, line_number, f"id {local_id!r} already used on line {first_line_of_id[example_id]}"
                )
            first_line_of_id[example_id] = line_number
            examples.append(
                Example(
                    id=example_id,
                    task=task,
                    prompt=question + instruction,
                    answer=answer,
                    split=split_of(question, heldout_fraction),
                    metadata=metadata,
                )
            )
    if not examples:
        raise DatasetFormatError(path, 1, "no examples: the file is empty")
    return examples


def _parse_line(path: Path, line_number: int, line: str) -> dict[str, Any]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetFormatError(path, line_number, f"malformed JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(record, dict):
        raise DatasetFormatError(
            path, line_number, f"expected a JSON object, got {type(record).__name__}: {line.strip()[:80]}"
        )
    return record


def _fields(path: Path, line_number: int, record: dict[str, Any]):
    """(question, answer text, id or None, metadata) of one record."""

    def fail(problem: str):
        raise DatasetFormatError(path, line_number, problem)

    present = [name for name in _QUESTION_FIELDS if name in record]
    if len(present) != 1:
        fail(
            f"need exactly one of the fields 'prompt' or 'problem', found {present or 'neither'} "
            f"(fields: {sorted(record)})"
        )
    question = record[present[0]]
    if not isinstance(question, str) or not question.strip():
        fail(f"field {present[0]!r} must be a non-empty string, got {_describe(question)}")

    if "answer" in record:
        answer = record["answer"]
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)):
            fail(f"field 'answer' must be a string or a number, got {_describe(answer)}")
        answer = str(answer).strip()
        if not answer:
            fail("field 'answer' is empty")
    elif "solution" in record:
        solution = record["solution"]
        if not isinstance(solution, str):
            fail(f"field 'solution' must be a string, got {_describe(solution)}")
        answer = extract_last_boxed(solution)
        if not answer:
            fail("field 'solution' has no closed, non-empty \\boxed{...} to take the answer from")
    else:
        fail(f"need a field 'answer' or 'solution' (fields: {sorted(record)})")

    local_id = record.get("id")
    if local_id is not None and (isinstance(local_id, bool) or not isinstance(local_id, (str, int))):
        fail(f"field 'id' must be a string or an integer, got {_describe(local_id)}")
    metadata = {k: v for k, v in record.items() if k not in (*_QUESTION_FIELDS, "answer", "id")}
    return question, answer, local_id, metadata


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {json.dumps(value)[:60]}"


@register_task("jsonl")
class JsonlTask(Task):
    """A JSONL file as a task: draws from its train or held-out questions.

    Args:
      path: the JSONL file (format above).
      heldout_fraction: share of questions held out, by question hash.
      instruction: appended to every question (default asks for \\boxed{}).
    """

    reward_fn = staticmethod(math_verify_reward)

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
        instruction: str = BOXED_INSTRUCTION,
    ):
        self.path = Path(path)
        self.name = f"jsonl:{self.path.stem}"
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self._examples = load_jsonl(
            path, heldout_fraction=heldout_fraction, instruction=instruction, task=self.name
        )

    def all_examples(self, split: str) -> list[Example]:
        check_split(split)
        return [example for example in self._examples if example.split == split]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        pool = self.all_examples(split)
        if not pool:
            raise ValueError(
                f"{self.path} has no {split} examples (heldout_fraction={self.heldout_fraction}, "
                f"{len(self._examples)} examples in all)"
            )
        rng = random.Random(seed)
        if unique:
            if n > len(pool):
                raise ValueError(f"{self.path} has {len(pool)} {split} examples, {n} distinct requested")
            return rng.sample(pool, n)
        return [rng.choice(pool) for _ in range(n)]
