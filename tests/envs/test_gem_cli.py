"""`jaxrl train` with task.name=gem as a user runs it: bad inputs are one line with exit status 2,
before any model loads; and one training step on the JAX sampler."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.train.tiny_run import REPO, TINY_OVERRIDES, model_metrics

CONFIG = str(REPO / "experiments/gem_game.py")
MISSING_GEM = "import sys; sys.modules['gem'] = None; from jaxrl_llm.cli import main; sys.exit(main())"  # as if not installed

BAD = {  # name -> (task.kwargs, words the one line must hold)
    "unknown id": ({"env_id": "game:GuessTheNumbr-v0-easy"},
                   ["'game:GuessTheNumbr-v0-easy' is not a GEM environment",
                    "did you mean 'game:GuessTheNumber-v0-easy'", "valid:"]),
    "needs a download": ({"env_id": "game:Wordle-v0-easy"}, ["'game:Wordle-v0-easy'", "nltk.download", "valid:"]),
    "Hub data set": ({"env_id": "math:GSM8K"}, ["'math:GSM8K'", "Hugging Face Hub", "task.data_path"]),
    "unknown argument": ({"env_id": "game:GuessTheNumber-v0-easy", "max_turn": 3},
                         ["'max_turn'", "valid: min_number, max_number, max_turns"]),
    "missing gem-llm": ({"env_id": "game:GuessTheNumber-v0-easy"}, ["gem-llm", "pip install", "gem-llm==0.1.0"]),
}


def start(name: str, kwargs: dict, run_dir) -> subprocess.Popen:
    entry = ["-c", MISSING_GEM] if name == "missing gem-llm" else ["-m", "jaxrl_llm.cli"]
    argv = [sys.executable, *entry, "train", "--config", CONFIG, f"task.kwargs={json.dumps(kwargs)}",
            f"run_dir={run_dir}"]
    return subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_bad_gem_inputs_are_one_line_with_exit_status_2(tmp_path):
    runs = {name: start(name, kwargs, tmp_path / str(i)) for i, (name, (kwargs, _)) in enumerate(BAD.items())}
    for name, proc in runs.items():  # all at once: each is a few seconds of imports
        out, err = proc.communicate(timeout=240)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (name, out, err)
        assert lines[0].startswith("jaxrl train: error: ") and "Traceback" not in err
        for word in BAD[name][1]:
            assert word in lines[0], (name, lines[0])


def train(run_dir, model_dir, *extra: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", CONFIG, *TINY_OVERRIDES,
            f"model.source={model_dir}", f"run_dir={run_dir}", "rollout.max_tokens=32", "task.turn_max_tokens=4",
            "task.max_turns=2", "checkpoint.every_steps=1", *extra]
    return subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out


@pytest.mark.timeout(900)
def test_training_steps_on_the_jax_sampler_and_resume(tiny_model_dir, tmp_path):
    """One step of `jaxrl train` on a GEM game, continued by --resume for a second: both steps'
    metrics equal a straight two-step run's (the same seeds, so the same GEM episodes)."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    runs = [train(straight, tiny_model_dir, "total_steps=2"), train(resumed, tiny_model_dir, "total_steps=1")]
    for proc in runs:
        finished(proc)
    assert [r["step"] for r in model_metrics(resumed)] == [1]  # the one-step run
    finished(train(resumed, tiny_model_dir, "total_steps=2", "--resume"))
    want, got = model_metrics(straight), model_metrics(resumed)
    assert [r["step"] for r in got] == [1, 2]
    # a random model never writes \boxed{N}: every episode is GEM's format error, -0.1, after one turn
    assert want[0]["reward"] == pytest.approx(-0.1) and want[0]["episode_turns"] == 1
    for w, g in zip(want, got):
        assert w.keys() == g.keys()
        for key in set(w) - {"time"}:  # "time": the wall clock of the log line
            np.testing.assert_equal(g[key], w[key], err_msg=f"step {w['step']} {key}")
