"""`jaxrl train` with task.name=gem as a user runs it: bad inputs are one line with exit status 2,
before any model loads; and the README's GEM line for one training step on the JAX sampler, then resumed."""
import json
import os
import subprocess

import numpy as np
import pytest

from tests.one_line_errors import CLI, finish, one_line_error, start_jaxrl, without
from tests.readme_commands import readme_argv
from tests.train.tiny_run import REPO, TINY_OVERRIDES, model_metrics

CONFIG = str(REPO / "experiments/gem_game.py")

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
ENTRY = {"missing gem-llm": without("gem")}  # the CLI run as if the package were not installed


def test_bad_gem_inputs_are_one_line_with_exit_status_2(tmp_path):
    runs = {name: start_jaxrl("train", "--config", CONFIG, f"task.kwargs={json.dumps(kwargs)}",
                              f"run_dir={tmp_path / str(i)}", entry=ENTRY.get(name, CLI))
            for i, (name, (kwargs, _)) in enumerate(BAD.items())}
    for name, proc in runs.items():  # all at once: each is a few seconds of imports
        one_line_error(finish(proc, timeout=240), BAD[name][1])


def train(run_dir, model_dir, *extra: str) -> subprocess.Popen:
    argv = [*readme_argv("gem"), *TINY_OVERRIDES, f"model.source={model_dir}", f"run_dir={run_dir}",
            "rollout.max_tokens=32", "task.turn_max_tokens=4", "task.max_turns=2", "checkpoint.every_steps=1", *extra]
    return subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finished(proc: subprocess.Popen) -> None:
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out


@pytest.mark.timeout(900)
def test_training_steps_on_the_jax_sampler_and_resume(tiny_model_dir, tmp_path):
    """One step of the README's GEM line (`jaxrl train`) on the tiny model, continued by --resume for a
    second: both steps' metrics equal a straight two-step run's (the same seeds, so the same GEM episodes)."""
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
