"""`jaxrl train` with task.name=verifiers as a user runs it: bad inputs are one line with exit status 2,
before any model loads; and one training step of experiments/verifiers_env.py on the JAX sampler."""
import json
import os
import subprocess
import sys

import pytest

from tests.train.tiny_run import REPO, TINY_OVERRIDES, model_metrics

CONFIG = str(REPO / "experiments/verifiers_env.py")
MISSING = "import sys; sys.modules['verifiers'] = None; from jaxrl_llm.cli import main; sys.exit(main())"  # as if not installed
LOCAL = "tests.envs.verifiers_local_envs"

BAD = {  # name -> (task.kwargs, words the one line must hold)
    "unknown env id": ({"env_id": "vf-no-such-env"},
                       ["'vf-no-such-env' is not a verifiers environment", "no module 'vf_no_such_env'", "valid:"]),
    "unknown loader": ({"env_id": f"{LOCAL}:load_revers"}, [f"'{LOCAL}:load_revers'", "has no attribute"]),
    "unknown env argument": ({"env_id": f"{LOCAL}:load_reverse", "env_args": {"row": 3}},
                             ["'row'", "did you mean 'rows'", "valid: rows"]),
    "missing verifiers": ({"env_id": f"{LOCAL}:load_reverse"}, ["verifiers package", "pip install", "verifiers==0.3.1"]),
}


def start(name: str, kwargs: dict, run_dir) -> subprocess.Popen:
    entry = ["-c", MISSING] if name == "missing verifiers" else ["-m", "jaxrl_llm.cli"]
    argv = [sys.executable, *entry, "train", "--config", CONFIG, f"task.kwargs={json.dumps(kwargs)}",
            f"run_dir={run_dir}"]
    return subprocess.Popen(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_bad_verifiers_inputs_are_one_line_with_exit_status_2(tmp_path):
    runs = {name: start(name, kwargs, tmp_path / str(i)) for i, (name, (kwargs, _)) in enumerate(BAD.items())}
    for name, proc in runs.items():  # all at once: each is a few seconds of imports
        out, err = proc.communicate(timeout=300)
        lines = [line for line in err.splitlines() if line.strip()]
        assert proc.returncode == 2 and len(lines) == 1, (name, out, err)
        assert lines[0].startswith("jaxrl train: error: ") and "Traceback" not in err
        for word in BAD[name][1]:
            assert word in lines[0], (name, lines[0])


@pytest.mark.timeout(900)
def test_one_training_step_of_the_example_config(tiny_model_dir, tmp_path):
    """experiments/verifiers_env.py for one step on the tiny model: the step's reward is the rubric's
    mean over its 2 x 4 episodes, which lies in [0, 1.2] (similarity + 0.2 brevity)."""
    argv = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", CONFIG, *TINY_OVERRIDES,
            f"model.source={tiny_model_dir}", f"run_dir={tmp_path}", "total_steps=1", "rollout.max_tokens=8",
            "task.turn_max_tokens=8"]
    proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout
    [step] = model_metrics(tmp_path)
    assert step["step"] == 1 and step["episode_turns"] == 1
    assert 0.0 <= step["reward"] <= 1.2
