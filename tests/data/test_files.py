"""User data files (data/files.py). Task "data_file": the same rows written as JSON, JSONL,
CSV and Parquet give the hand-written examples; a bad row names the file and row. Task
"jsonl": the shipped MATH-style example, grading, and errors naming file and line."""
from __future__ import annotations

import json
import os

os.environ["HF_DATASETS_OFFLINE"] = "1"  # local files only: no network, before datasets is imported

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from jaxrl_llm.data import (BOXED_INSTRUCTION, EXAMPLES_DIR, HELDOUT, TRAIN, DatasetFormatError, Example, JsonlTask,
                            load_jsonl, make_task, read_rows)
from jaxrl_llm.data.records import short_hash, split_of
from jaxrl_llm.rewards import math_verify_reward

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


# ---- task "jsonl": MATH-style JSONL lines ----

EXAMPLE_FILE = EXAMPLES_DIR / "math_small.jsonl"


def test_shipped_example_file_loads_with_expected_answers():
    lines = [json.loads(line) for line in EXAMPLE_FILE.read_text().splitlines() if line.strip()]
    examples = load_jsonl(EXAMPLE_FILE)
    assert len(examples) == len(lines) >= 10
    by_id = {e.id: e for e in examples}
    # answers given directly, as strings or numbers
    assert by_id["math_small/percent"].answer == "12"
    assert by_id["math_small/power"].answer == "1024"
    # answers taken from the last \boxed{} of a MATH-style solution
    assert by_id["math_small/vieta"].answer == "7"
    assert by_id["math_small/half-of-three"].answer == "1.5"
    assert by_id["math_small/circle"].metadata == {"level": 2}
    assert by_id["math_small/power"].prompt == "Compute $2^{10}$." + BOXED_INSTRUCTION


@pytest.mark.parametrize(
    "example_id, completion, expected",
    [
        ("frac-sum", "1/2 + 1/4 = \\boxed{\\frac{3}{4}}", 1.0),
        ("frac-sum", "\\boxed{0.75}", 1.0),
        ("frac-sum", "\\boxed{\\frac{2}{6}}", 0.0),
        ("dice", "6 of 36 outcomes: \\boxed{1/6}", 1.0),
        ("sqrt", "\\boxed{\\sqrt{2}\\cdot 5}", 1.0),
        ("sqrt", "\\boxed{7.07}", 0.0),
        ("half-of-three", "\\boxed{\\frac{3}{2}}", 1.0),
        ("circle", "\\boxed{9\\pi}", 1.0),
        ("power", "\\boxed{1024}", 1.0),
        ("power", "1024", 0.0),  # no box
    ],
)
def test_example_file_graded_by_math_verify(example_id, completion, expected):
    example = {e.id: e for e in load_jsonl(EXAMPLE_FILE)}[f"math_small/{example_id}"]
    assert math_verify_reward(completion, example) == expected


def test_jsonl_task_splits_are_a_partition_and_draws_deterministic():
    task = make_task("jsonl", path=EXAMPLE_FILE, heldout_fraction=0.5)
    train, heldout = task.all_examples(TRAIN), task.all_examples(HELDOUT)
    assert {e.id for e in train} | {e.id for e in heldout} == {e.id for e in load_jsonl(EXAMPLE_FILE)}
    assert not {e.id for e in train} & {e.id for e in heldout}
    assert task.examples(TRAIN, 20, seed=1) == task.examples(TRAIN, 20, seed=1)
    assert {e.id for e in task.examples(TRAIN, 20, seed=1)} <= {e.id for e in train}
    assert sorted(e.id for e in task.examples(HELDOUT, len(heldout), seed=2, unique=True)) == sorted(
        e.id for e in heldout
    )
    with pytest.raises(ValueError, match=f"has {len(heldout)} heldout examples, {len(heldout) + 1} distinct"):
        task.examples(HELDOUT, len(heldout) + 1, seed=2, unique=True)
    assert task.reward_fn is math_verify_reward


GOOD = '{"problem": "1+1?", "answer": "2"}'


@pytest.mark.parametrize(
    "lines, bad_line, message",
    [
        ([GOOD, GOOD, '{"problem": "2+2?", "answer": "4"'], 3, "malformed JSON"),
        ([GOOD, "", '["problem", "answer"]'], 3, "expected a JSON object, got list"),
        ([GOOD, '{"problem": "2+2?"}'], 2, "need a field 'answer' or 'solution'"),
        (['{"question": "2+2?", "answer": "4"}'], 1, "need exactly one of the fields 'prompt' or 'problem'"),
        (['{"prompt": "a", "problem": "b", "answer": "4"}'], 1, "found ['prompt', 'problem']"),
        ([GOOD, '{"problem": "2+2?", "answer": [4]}'], 2, "'answer' must be a string or a number, got list"),
        (['{"problem": "2+2?", "answer": true}'], 1, "'answer' must be a string or a number, got bool"),
        (['{"problem": 7, "answer": "4"}'], 1, "'problem' must be a non-empty string, got int"),
        (['{"problem": " ", "answer": "4"}'], 1, "'problem' must be a non-empty string"),
        (['{"problem": "2+2?", "solution": "it is 4"}'], 1, "has no closed, non-empty \\boxed"),
        (['{"problem": "2+2?", "answer": "4", "id": 1}', '{"problem": "3+3?", "answer": "6", "id": 1}'], 2,
         "id 1 already used on line 1"),
        (['{"problem": "2+2?", "answer": "4", "id": [1]}'], 1, "'id' must be a string or an integer"),
        (["", "  "], 1, "no examples: the file is empty"),
    ],
)
def test_malformed_files_name_the_file_and_line(tmp_path, lines, bad_line, message):
    path = tmp_path / "broken.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetFormatError) as caught:
        load_jsonl(path)
    assert str(caught.value).startswith(f"{path}:{bad_line}: ")
    assert message in str(caught.value)
    assert (caught.value.path, caught.value.line) == (str(path), bad_line)


def test_answer_wins_over_solution_and_instruction_can_be_dropped(tmp_path):
    path = tmp_path / "both.jsonl"
    path.write_text('{"problem": "p", "solution": "so \\\\boxed{3}", "answer": "4"}\n')
    (example,) = load_jsonl(path, instruction="")
    assert (example.prompt, example.answer, example.id) == ("p", "4", "both/line1")
    assert example.metadata == {"solution": "so \\boxed{3}"}


def test_jsonl_task_refuses_an_empty_split(tmp_path):
    task = JsonlTask(EXAMPLE_FILE, heldout_fraction=0.0)
    with pytest.raises(ValueError, match="no heldout questions: heldout_fraction=0.0"):
        task.examples(HELDOUT, 1, seed=0)
