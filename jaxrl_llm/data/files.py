"""User data files read with the Hugging Face ``datasets`` library: JSON, JSONL, Parquet, CSV.

Each row is one question: the column ``prompt_field`` holds the question (a
non-empty string) and ``answer_field`` the reference answer (a string or a
number; CSV cells are kept as written, and an integral float such as 42.0,
which a JSON or Parquet column mixing 42 and 0.5 holds, becomes "42"); every
other column goes to the example's metadata. Only local files
are read (``datasets``' packaged "json", "parquet" and "csv" builders), so a
run needs no network. The split rule is the one of every task
(:mod:`jaxrl_llm.data.records`): by the question's hash.

    task.data_path=problems.csv task.prompt_field=question task.answer_field=target

Graded by math-verify by default, as JSONL sets are; ``task.reward_fn`` picks
another grader.
"""
from __future__ import annotations

import math
import os
import random
from pathlib import Path
from typing import Any

from jaxrl_llm.data.jsonl import BOXED_INSTRUCTION, DatasetFormatError
from jaxrl_llm.data.records import Example, check_heldout_fraction, check_split, short_hash, split_of
from jaxrl_llm.data.registry import register_task
from jaxrl_llm.data.task_base import DEFAULT_HELDOUT_FRACTION, Task
from jaxrl_llm.rewards import math_verify_reward

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


@register_task("data_file")
class DataFileTask(Task):
    """A JSON/JSONL/Parquet/CSV file as a task: draws from its train or held-out questions.

    Args:
      path: the file; its suffix picks the reader (see FORMATS).
      prompt_field, answer_field: the columns holding question and answer.
      instruction: appended to every question (default asks for \\boxed{}).
      heldout_fraction: share of questions held out, by question hash.
    """

    reward_fn = staticmethod(math_verify_reward)

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        prompt_field: str = "prompt",
        answer_field: str = "answer",
        instruction: str = BOXED_INSTRUCTION,
        heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    ):
        self.path = Path(path)
        self.name = f"data_file:{self.path.stem}"
        self.heldout_fraction = check_heldout_fraction(heldout_fraction)
        self._examples = examples_from_rows(
            read_rows(path, text_columns=(prompt_field, answer_field)), path=path, task=self.name, prompt_field=prompt_field, answer_field=answer_field,
            instruction=instruction, heldout_fraction=self.heldout_fraction)

    def all_examples(self, split: str) -> list[Example]:
        check_split(split)
        return [example for example in self._examples if example.split == split]

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        pool = self.all_examples(split)
        if not pool or (unique and n > len(pool)):
            raise ValueError(f"{self.path} has {len(pool)} {split} examples (heldout_fraction="
                             f"{self.heldout_fraction}, {len(self._examples)} in all); {n} "
                             f"{'distinct ' if unique else ''}requested")
        rng = random.Random(seed)
        return rng.sample(pool, n) if unique else [rng.choice(pool) for _ in range(n)]
