"""Kill-and-resume helpers of the train tests: wait until a child run has logged a step, kill
it with SIGKILL (as the OOM killer or a lost machine would), and compare a resumed run's
metrics with an uninterrupted one's."""
from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import numpy as np

from tests.train.learning_setup import REPO, child_command, child_env

PARAM_ATOL = 1e-6
WAIT_S = 600


def kill_after_step(proc: subprocess.Popen, metrics_file: Path, step: int) -> None:
    """SIGKILLs `proc` once `metrics_file` has `step` lines (fails if it exits first)."""
    deadline = time.time() + WAIT_S
    while time.time() < deadline:
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= step:
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


def kill_after_logged_step(model_dir: str, run_dir: Path, step: int, overrides) -> int:
    """Runs the learning setup (tests/train/learning_setup.py) in a child process and SIGKILLs
    it once `step` is logged; returns its return code."""
    child = subprocess.Popen(child_command(model_dir, run_dir, *overrides), cwd=REPO, env=child_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kill_after_step(child, run_dir / "metrics.jsonl", step)
    return child.returncode


def assert_rows_equal(got: list[dict], want: list[dict]) -> None:
    """Same steps, same keys, every value within rtol 1e-6 / atol 1e-7."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for have, expect in zip(got, want):
        assert have.keys() == expect.keys()
        for key in expect:
            np.testing.assert_allclose(have[key], expect[key], rtol=1e-6, atol=1e-7,
                                       err_msg=f"step {expect['step']} {key}")
