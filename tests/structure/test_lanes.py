"""make test's lane runner (tests/lanes.py): the queue order, the exit-5 rule, and a real run of
two tiny folders in two lanes (one passes, one fails) whose failure is named."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests import lanes

REPO = Path(__file__).resolve().parents[2]


def test_longest_first_by_the_measured_minutes_unmeasured_as_one():
    order = lanes.longest_first(["tests/zeta/", "tests/data/", "tests/train/", "tests/alpha/", "tests/rollout/"])
    # train 17.2, rollout 13.0, then alpha / zeta (1.0, alphabetical), then data 0.4
    assert order == ["tests/train/", "tests/rollout/", "tests/alpha/", "tests/zeta/", "tests/data/"]


def test_nothing_collected_passes_only_for_slow_only_folders():
    assert lanes.passed(0, "tests/a/", set())
    assert not lanes.passed(5, "tests/a/", set())
    assert lanes.passed(5, "tests/a/", {"tests/a"})
    assert not lanes.passed(1, "tests/a/", {"tests/a"})


def test_two_lanes_run_both_folders_and_name_the_failed_one(tmp_path):
    for name, body in [("good", "assert 1 + 1 == 2"), ("bad", "assert 1 + 1 == 3")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / f"test_{name}.py").write_text(f"def test_it():\n    {body}\n")
    record = tmp_path / "record"
    done = subprocess.run([sys.executable, "-m", "tests.lanes", str(record), "--lanes", "2",
                           "--folders", f"{tmp_path}/good/", f"{tmp_path}/bad/", "--", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == f"make test: FAILED in {tmp_path}/bad/"
    assert "1 passed" in done.stdout and "1 failed" in done.stdout
    lane_logs = sorted(p.name for p in record.glob("lane-*/*.log"))
    assert len(lane_logs) == 2 and {p.name for p in record.iterdir()} == {"lane-1", "lane-2"}
