"""Progress: plain lines without a TTY (with ETA), tqdm bar with a postfix on one."""

import io

import numpy as np
import pytest

from jaxrl_llm.train.run.progress import Progress, is_interactive


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


def test_lines_every_n_steps_with_eta_from_this_session(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    clock, out = FakeClock(), io.StringIO()
    # Resumed at step 10 of 100; every step takes 2 s.
    progress = Progress(100, initial=10, keys=("reward/mean", "loss"), print_every=5, stream=out, clock=clock)
    for step in range(11, 21):
        clock.now += 2.0
        progress.update(step, {"reward/mean": 0.5, "loss": np.float32(0.012345678), "other": 1.0})
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # steps 15 and 20
    # 10 steps in 20 s -> 2 s/step; 80 steps left -> 160 s = 0:02:40
    assert lines[1] == "train step 20/100 (20%) | 2 s/step | elapsed 0:00:20 | ETA 0:02:40 | reward/mean=0.5 loss=0.01235"
    assert progress.eta_seconds() == pytest.approx(160.0)


def test_last_step_is_always_printed():
    clock, out = FakeClock(), io.StringIO()
    progress = Progress(7, print_every=5, stream=out, clock=clock, enabled=False)
    for step in range(1, 8):
        clock.now += 1.0
        progress.update(step, {"a": 1})
    assert [line.split(" | ")[0] for line in out.getvalue().splitlines()] == ["train step 5/7 (71%)", "train step 7/7 (100%)"]
    assert "ETA 0:00:00" in out.getvalue().splitlines()[-1]


def test_tty_shows_a_bar_with_postfix_and_ci_disables_it(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    out = FakeTTY()
    assert is_interactive(out)
    with Progress(4, keys=("reward/mean",), stream=out) as progress:
        assert progress.bar is not None
        for step in range(1, 5):
            progress.update(step, {"reward/mean": 0.25 * step, "loss": 3.0})
        assert progress.bar.n == 4
    text = out.getvalue()
    assert "4/4" in text and "reward/mean=1" in text and "loss" not in text
    monkeypatch.setenv("CI", "true")
    assert not is_interactive(out)
    assert Progress(4, stream=out).bar is None
    assert not is_interactive(io.StringIO())


def test_invalid_arguments():
    with pytest.raises(ValueError, match=r"total = 3 is below initial = 5"):
        Progress(3, initial=5)
    with pytest.raises(ValueError, match=r"print_every = 0 is invalid"):
        Progress(3, print_every=0)
