"""`jaxrl train` with a bad LLM judge (task.judge): one line naming the field and what is valid, exit status 2,
before any model loads."""
from pathlib import Path

import pytest

from tests.one_line_errors import jaxrl, one_line_error


@pytest.mark.parametrize("overrides, names", [
    (["task.judge.model=/no/such/judge"],
     ["task.judge.model = '/no/such/judge'", "no such directory", "valid: 'smollm2', an HF directory"]),
    (["task.judge.rubric=Rate this answer: {response}"],
     ["task.judge.rubric", "does not state the score format 'Score: <0-10>'", "valid:"]),
    (["task.judge.score_format=Score 0-10"], ["task.judge.score_format", "'Score 0-10'", "valid:"]),
    (["task.reward_fn=exact"], ["task.judge.model = 'smollm2'", "do not include 'judge'", "valid:"]),
], ids=["model-missing", "rubric-without-format", "format-unreadable", "judge-not-named"])
def test_bad_judge_is_one_line_with_exit_status_2(tmp_path, overrides, names):
    one_line_error(jaxrl("train", "--config", "experiments/judge.py", f"run_dir={tmp_path / 'run'}", *overrides), names)
    assert not Path(tmp_path / "run" / "metrics.jsonl").exists()
