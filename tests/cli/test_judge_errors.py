"""`jaxrl train` with a bad LLM judge (task.judge): one line naming the field and what is valid, exit status 2,
before any model loads."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def jaxrl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "jaxrl_llm.cli", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=300)


@pytest.mark.parametrize("overrides, names", [
    (["task.judge.model=/no/such/judge"],
     ["task.judge.model = '/no/such/judge'", "no such directory", "valid: 'smollm2', an HF directory"]),
    (["task.judge.rubric=Rate this answer: {response}"],
     ["task.judge.rubric", "does not state the score format 'Score: <0-10>'", "valid:"]),
    (["task.judge.score_format=Score 0-10"], ["task.judge.score_format", "'Score 0-10'", "valid:"]),
    (["task.reward_fn=exact"], ["task.judge.model = 'smollm2'", "do not include 'judge'", "valid:"]),
], ids=["model-missing", "rubric-without-format", "format-unreadable", "judge-not-named"])
def test_bad_judge_is_one_line_with_exit_status_2(tmp_path, overrides, names):
    done = jaxrl("train", "--config", "experiments/judge.py", f"run_dir={tmp_path / 'run'}", *overrides)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("[jaxrl]")]
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr and "error:" in lines[0]
    for name in names:
        assert name in lines[0], lines[0]
    assert not Path(tmp_path / "run" / "metrics.jsonl").exists()
