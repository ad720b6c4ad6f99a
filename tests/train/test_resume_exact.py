"""kill -9 + --resume exactness of runs with a reference policy (KL term) and with a
learned critic: the resumed run's per-step metrics equal an uninterrupted run's.
Graded by tests/train/rl_worker.py's parity reward so the policy actually moves."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl_llm.train.config import save_config
from tests.train.test_loop import REPO, model_metrics, tiny_config, tiny_model_dir  # noqa: F401 (fixture)


def start_worker(config_path, *flags) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.train.rl_worker", str(config_path), *flags], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def kill_after_step(proc: subprocess.Popen, metrics_file, step: int) -> None:
    deadline = time.time() + 600
    while time.time() < deadline:
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= step:
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.2)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)


RUNS = {
    "kl_loss": ["recipe.name=grpo", "recipe.kl_beta=0.5", "recipe.kl_estimator=k3"],
    "ppo_critic": ["recipe.name=ppo", "critic.lr=1e-2", "critic.warmup_steps=1", "train.epochs_per_batch=2"],
}
MOVED = {"kl_loss": "kl", "ppo_critic": "value_mean"}  # a metric that is 0 until the run leaves its start


# kl_loss is slow (~1 min; make test-all); ppo_critic (the critic in the checkpoint) runs in make test.
@pytest.mark.timeout(900)  # two runs side by side, then a resume, each allowed 600 s
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "kl_loss" else n for n in sorted(RUNS)])
def test_kill_9_then_resume_is_exact(tiny_model_dir, tmp_path, name):  # noqa: F811
    configs = {}
    for run in ("straight", "crashed"):
        configs[run] = tmp_path / f"{run}.json"
        save_config(tiny_config(tiny_model_dir, tmp_path / run, *RUNS[name]), configs[run])
    straight = start_worker(configs["straight"])  # runs alongside the victim
    victim = start_worker(configs["crashed"])
    kill_after_step(victim, tmp_path / "crashed" / "metrics.jsonl", 2)
    assert victim.returncode == -signal.SIGKILL  # killed mid-run: steps 3-4 come from the resumed process
    resumed = start_worker(configs["crashed"], "--resume")
    assert resumed.wait(timeout=600) == 0, resumed.stdout.read()
    assert straight.wait(timeout=600) == 0, straight.stdout.read()

    expected, got = model_metrics(tmp_path / "straight"), model_metrics(tmp_path / "crashed")
    assert [row["step"] for row in got] == [1, 2, 3, 4]
    assert expected[0]["reward"] > 0 and abs(expected[-1][MOVED[name]]) > 0  # policy / critic moved
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in want:
            np.testing.assert_allclose(have[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
