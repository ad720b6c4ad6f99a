"""`jaxrl train` with task.name=verifiers as a user runs it: bad inputs are one line with exit status 2,
before any model loads; and the README's verifiers line for one training step on the JAX sampler."""
import json
import os
import subprocess

import pytest

from tests.one_line_errors import CLI, finish, one_line_error, start_jaxrl, without
from tests.readme_commands import readme_argv
from tests.train.tiny_run import REPO, TINY_OVERRIDES, model_metrics

CONFIG = str(REPO / "experiments/verifiers_env.py")
LOCAL = "tests.envs.verifiers_local_envs"

BAD = {  # name -> (task.kwargs, words the one line must hold)
    "unknown env id": ({"env_id": "vf-no-such-env"},
                       ["'vf-no-such-env' is not a verifiers environment", "no module 'vf_no_such_env'", "valid:"]),
    "unknown loader": ({"env_id": f"{LOCAL}:load_revers"}, [f"'{LOCAL}:load_revers'", "has no attribute"]),
    "unknown env argument": ({"env_id": f"{LOCAL}:load_reverse", "env_args": {"row": 3}},
                             ["'row'", "did you mean 'rows'", "valid: rows"]),
    "missing verifiers": ({"env_id": f"{LOCAL}:load_reverse"}, ["verifiers package", "pip install", "verifiers==0.3.1"]),
}
ENTRY = {"missing verifiers": without("verifiers")}  # the CLI run as if the package were not installed


def test_bad_verifiers_inputs_are_one_line_with_exit_status_2(tmp_path):
    runs = {name: start_jaxrl("train", "--config", CONFIG, f"task.kwargs={json.dumps(kwargs)}",
                              f"run_dir={tmp_path / str(i)}", entry=ENTRY.get(name, CLI))
            for i, (name, (kwargs, _)) in enumerate(BAD.items())}
    for name, proc in runs.items():  # all at once: each is a few seconds of imports
        one_line_error(finish(proc, timeout=300), BAD[name][1])


@pytest.mark.timeout(900)
def test_one_training_step_of_the_example_config(tiny_model_dir, tmp_path):
    """The README's verifiers line (experiments/verifiers_env.py) for one step on the tiny model: the
    step's reward is the rubric's mean over its 2 x 4 episodes, which lies in [0, 1.2] (similarity + 0.2 brevity)."""
    argv = [*readme_argv("verifiers"), *TINY_OVERRIDES, f"model.source={tiny_model_dir}", f"run_dir={tmp_path}",
            "total_steps=1", "rollout.max_tokens=8", "task.turn_max_tokens=8"]
    proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=800)
    assert proc.returncode == 0, proc.stdout
    [step] = model_metrics(tmp_path)
    assert step["step"] == 1 and step["episode_turns"] == 1
    assert 0.0 <= step["reward"] <= 1.2
