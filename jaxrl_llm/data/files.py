"""User data files as tasks: JSONL question/answer lines (task "jsonl") and JSON, JSONL,
Parquet or CSV tables read with the Hugging Face ``datasets`` library (task "data_file").

task "jsonl": one JSON object per non-blank line, MATH-style, with

  the question:  "prompt" or "problem" (a non-empty string; exactly one of them)
  the answer:    "answer" (a string or a number), or else "solution" (a string
                 whose last \\boxed{...} is the answer, as in MATH). When both
                 are present "answer" wins and "solution" is kept in metadata.
  optionally:    "id" (string or integer, unique in the file); every other
                 field goes to metadata unchanged.

    {"problem": "What is 1/2 + 1/4?", "answer": "\\\\frac{3}{4}"}
    {"prompt": "Compute 6 * 7.", "answer": 42, "id": "mul-1"}
    {"problem": "Half of 3?", "solution": "Half of 3 is $\\\\boxed{\\\\frac{3}{2}}$."}

task "data_file": each row is one question: the column ``prompt_field`` holds the question
(a non-empty string) and ``answer_field`` the reference answer (a string or a number; CSV
cells are kept as written, and an integral float such as 42.0, which a JSON or Parquet
column mixing 42 and 0.5 holds, becomes "42"); every other column goes to the example's
metadata. Only local files are read (``datasets``' packaged "json", "parquet" and "csv"
builders), so a run needs no network.

    task.data_path=problems.csv task.prompt_field=question task.answer_field=target

Both split by the question's hash (:mod:`jaxrl_llm.data.records`), report a bad line or row
as :class:`DatasetFormatError` naming the file and line, and are graded by
:func:`jaxrl_llm.rewards.math_verify_reward` (``task.reward_fn`` picks another grader).
"""
from __future__ import annotations

import json
import math
import os
import random
from pathlib import Path
from typing import Any, Callable

from jaxrl_llm.data.records import Example, check_heldout_fraction, check_split, short_hash, split_of
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


# The datasets builder for each file suffix.
FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


def data_file_format(path: str | os.PathLike) -> str:
    """The ``datasets`` builder name for ``path``'s suffix; ValueError for any other suffix."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ValueError(f"data file {os.fspath(path)!r} has suffix {suffix or '(none)'!r}; "
                         f"valid: {', '.join(sorted(FORMATS))}")
    return FORMATS[suffix]


def read_rows(path: str | os.PathLike, *, text_columns: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """All rows of a local data file as dicts, in file order (read with ``datasets``).

    In a CSV file the ``text_columns`` are kept as written ("007" stays "007"), not parsed
    as numbers.
    """
    builder = data_file_format(path)
    if not Path(path).is_file():
        raise FileNotFoundError(f"data file {os.fspath(path)!r} does not exist")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # local files only, never the Hub
    import datasets

    datasets.disable_progress_bars()
    options = {"converters": {column: str for column in text_columns}} if builder == "csv" else {}
    table = datasets.load_dataset(builder, data_files=str(Path(path).resolve()), split="train", keep_in_memory=True,
                                  **options)
    return [dict(row) for row in table]


def examples_from_rows(
    rows: list[dict[str, Any]],
    *,
    path: str | os.PathLike,
    task: str,
    prompt_field: str = "prompt",
    answer_field: str = "answer",
    instruction: str = BOXED_INSTRUCTION,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
) -> list[Example]:
    """One Example per row; a bad row is a DatasetFormatError naming the file and row (1-based)."""
    examples = []
    for number, row in enumerate(rows, start=1):
        def fail(problem: str):
            raise DatasetFormatError(path, number, f"row {number}: {problem} (columns: {sorted(row)})")

        for name in (prompt_field, answer_field):
            if name not in row:
                fail(f"no column {name!r}")
        question, answer = row[prompt_field], row[answer_field]
        if not isinstance(question, str) or not question.strip():
            fail(f"column {prompt_field!r} must be a non-empty string, got {question!r:.60}")
        if isinstance(answer, bool) or not isinstance(answer, (str, int, float)) or (
                isinstance(answer, float) and not math.isfinite(answer)):
            fail(f"column {answer_field!r} must be a string or a finite number, got {answer!r:.60}")
        if isinstance(answer, float) and answer.is_integer():
            answer = int(answer)  # a JSON/Parquet column mixing 42 and 0.5 is read as floats: 42.0
        answer = str(answer).strip()
        if not answer:
            fail(f"column {answer_field!r} is empty")
        examples.append(Example(
            id=f"{Path(path).stem}/{short_hash(question)}",
            task=task,
            prompt=question + instruction,
            answer=answer,
            split=split_of(question, heldout_fraction),
            metadata={k: v for k, v in row.items() if k not in (prompt_field, answer_field)},
        ))
    if not examples:
        raise DatasetFormatError(path, 1, "no examples: the file has no rows")
    return examples


class FileTask(Task):
    """The examples of one file, drawn from its train or held-out questions; the registered
    kinds below differ only in how the file is read."""

    reward_fn = staticmethod(math_verify_reward)

    def __init__(self, path: str | os.PathLike, kind: str, heldout_fraction: float,
                 load: Callable[[str], list[Example]]):
        self.path = Path(path)
        self.name = f"{kind}:{self.path.stem}"
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self._examples = load(self.name)

    def all_examples(self, split: str) -> list[Example]:
        check_split(split)
        return [example for example in self._examples if example.split == split]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        pool = self.all_examples(split)
        if not pool or (unique and n > len(pool)):
            raise ValueError(f"{self.path} has {len(pool)} {split} examples, {n} {'distinct ' if unique else ''}"
                             f"requested (heldout_fraction={self.heldout_fraction}, {len(self._examples)} "
                             "examples in all)")
        rng = random.Random(seed)
        return rng.sample(pool, n) if unique else [rng.choice(pool) for _ in range(n)]


@register_task("jsonl")
class JsonlTask(FileTask):
    """A JSONL file of question/answer lines (format above).

    Args:
      path: the JSONL file.
      heldout_fraction: share of questions held out, by question hash.
      instruction: appended to every question (default asks for \\boxed{}).
    """

    def __init__(self, path: str | os.PathLike, *, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
                 instruction: str = BOXED_INSTRUCTION):
        super().__init__(path, "jsonl", heldout_fraction, lambda name: load_jsonl(
            path, heldout_fraction=heldout_fraction, instruction=instruction, task=name))


@register_task("data_file")
class DataFileTask(FileTask):
    """A JSON/JSONL/Parquet/CSV file read with ``datasets``.

    Args:
      path: the file; its suffix picks the reader (see FORMATS).
      prompt_field, answer_field: the columns holding question and answer.
      instruction: appended to every question (default asks for \\boxed{}).
      heldout_fraction: share of questions held out, by question hash.
    """

    def __init__(self, path: str | os.PathLike, *, prompt_field: str = "prompt", answer_field: str = "answer",
                 instruction: str = BOXED_INSTRUCTION, heldout_fraction: float = DEFAULT_HELDOUT_FRACTION):
        super().__init__(path, "data_file", heldout_fraction, lambda name: examples_from_rows(
            read_rows(path, text_columns=(prompt_field, answer_field)), path=path, task=name,
            prompt_field=prompt_field, answer_field=answer_field, instruction=instruction,
            heldout_fraction=check_heldout_fraction(heldout_fraction)))
