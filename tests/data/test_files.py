"""Data files read with HF datasets (data/files.py): the same rows written as JSON, JSONL,
CSV and Parquet give the hand-written examples; a bad row names the file and row."""
from __future__ import annotations

import json
import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # local files only: no network, before datasets is imported

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_llm.data import HELDOUT, TRAIN, DatasetFormatError, Example, make_task, read_rows
from jaxrl_llm.data.records import short_hash, split_of

ROWS = [
    {"question": "What is 6 times 7?", "target": "42", "level": "easy"},
    {"question": "Name the capital of France, in lower case.", "target": "paris", "level": "easy"},
    {"question": "What is 1/2 + 1/4?", "target": "3/4", "level": "hard"},
]
INSTRUCTION = " Answer briefly."


def expected_examples(stem: str) -> list[Example]:
    """Written out by hand from ROWS (ids: file stem + sha256 of the question)."""
    return [Example(id=f"{stem}/{short_hash(r['question'])}", task=f"data_file:{stem}",
                    prompt=r["question"] + INSTRUCTION, answer=r["target"],
                    split=split_of(r["question"], 0.5), metadata={"level": r["level"]}) for r in ROWS]


def write(path, rows):
    suffix = path.suffix
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))  # one array of records
    elif suffix == ".csv":
        header = list(rows[0])
        lines = [",".join(header)] + [",".join(f'"{r[k]}"' for k in header) for r in rows]
        path.write_text("\n".join(lines) + "\n")
    elif suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_each_format_gives_the_hand_written_examples(tmp_path, suffix):
    path = write(tmp_path / f"problems{suffix}", ROWS)
    assert read_rows(path) == ROWS
    task = make_task("data_file", path=path, prompt_field="question", answer_field="target",
                     instruction=INSTRUCTION, heldout_fraction=0.5)
    want = expected_examples("problems")
    assert task.all_examples(TRAIN) + task.all_examples(HELDOUT) == (
        [e for e in want if e.split == TRAIN] + [e for e in want if e.split == HELDOUT])
    assert {e.split for e in want} == {TRAIN, HELDOUT}  # the file really is split


@pytest.mark.parametrize("suffix", [".csv", ".jsonl", ".parquet"])
def test_numeric_answers_become_their_text(tmp_path, suffix):
    rows = [{"prompt": "Six times seven?", "answer": 42}, {"prompt": "Half of one?", "answer": 0.5}]
    path = write(tmp_path / f"numbers{suffix}", rows)
    task = make_task("data_file", path=path, heldout_fraction=0.0)
    assert [e.answer for e in task.all_examples(TRAIN)] == ["42", "0.5"]


def test_csv_answers_are_kept_as_written(tmp_path):
    path = tmp_path / "codes.csv"
    path.write_text("prompt,answer\nThe agent?,007\nPi to two places?,3.10\n")
    task = make_task("data_file", path=path, heldout_fraction=0.0)
    assert [e.answer for e in task.all_examples(TRAIN)] == ["007", "3.10"]


@pytest.mark.parametrize("rows, field, message", [
    ([{"prompt": "Q?", "answer": "1"}, {"prompt": "R?"}], "prompt", "row 2: column 'answer' must be a string or a finite number, got None"),
    ([{"prompt": "Q?", "answer": "1"}, {"prompt": "", "answer": "2"}], "prompt", "row 2: column 'prompt' must be"),
    ([{"prompt": "Q?", "answer": "1"}], "question", "row 1: no column 'question'"),
])
def test_bad_rows_name_the_file_and_row(tmp_path, rows, field, message):
    path = write(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DatasetFormatError, match=message) as err:
        make_task("data_file", path=path, prompt_field=field)
    assert str(path) in str(err.value)


def test_unknown_suffix_lists_the_formats(tmp_path):
    path = tmp_path / "problems.xlsx"
    path.write_text("")
    with pytest.raises(ValueError, match=r"'.xlsx'; valid: .csv, .json, .jsonl, .parquet"):
        make_task("data_file", path=path)
