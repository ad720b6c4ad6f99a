"""kill -9 + --resume exactness of runs with a reference policy (KL term) and with a
learned critic: the resumed run's per-step metrics equal an uninterrupted run's.
Graded by tests/train/rl_worker.py's parity reward so the policy actually moves.
The kill loses work (steps logged after the newest checkpoint), which the resumed process
redoes, and nothing else; control: the same run at another learning rate ends elsewhere."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from jaxrl_llm.train.config import save_config
from tests.train.kill_resume import kill_after_step
from tests.train.tiny_run import REPO, model_metrics, tiny_config


def start_worker(config_path, *flags) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "tests.train.rl_worker", str(config_path), *flags], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def newest_checkpoint(run_dir) -> int:
    return max((int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit()), default=0)


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "time"} for row in rows]


RUNS = {
    "kl_loss": ["recipe.name=grpo", "recipe.kl_beta=0.5", "recipe.kl_estimator=k3"],
    "ppo_critic": ["recipe.name=ppo", "critic.lr=1e-2", "critic.warmup_steps=1", "train.epochs_per_batch=2"],
}
MOVED = {"kl_loss": "kl", "ppo_critic": "value_mean"}  # a metric that is 0 until the run leaves its start


# kl_loss is slow (~1 min; make test-all); ppo_critic (the critic in the checkpoint) runs in make test.
@pytest.mark.timeout(900)  # three runs and a resume, each allowed 600 s
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "kl_loss" else n for n in sorted(RUNS)])
def test_kill_9_then_resume_is_exact(tiny_model_dir, tmp_path, name):  # noqa: F811
    # 5 steps, a checkpoint every 2: killed once step 3 is logged, the newest checkpoint is step 2.
    common = [*RUNS[name], "total_steps=5", "checkpoint.every_steps=2"]
    configs = {}
    for run, extra in (("straight", ()), ("crashed", ()), ("control", ("train.lr=3e-3",))):
        configs[run] = tmp_path / f"{run}.json"
        save_config(tiny_config(tiny_model_dir, tmp_path / run, *common, *extra), configs[run])
    straight = start_worker(configs["straight"])  # runs alongside the victim
    victim = start_worker(configs["crashed"])
    crashed_dir = tmp_path / "crashed"
    kill_after_step(victim, crashed_dir / "metrics.jsonl", 3)
    killed_at = time.time()
    assert victim.returncode == -signal.SIGKILL  # killed mid-run: the later steps come from the resumed process
    logged, saved = len((crashed_dir / "metrics.jsonl").read_text().splitlines()), newest_checkpoint(crashed_dir)
    assert logged > saved, (logged, saved)  # work lost: steps logged after the newest checkpoint
    resumed = start_worker(configs["crashed"], "--resume")
    control = start_worker(configs["control"])
    for proc in (resumed, straight, control):
        assert proc.wait(timeout=600) == 0, proc.stdout.read()

    expected, got = without_time(model_metrics(tmp_path / "straight")), model_metrics(crashed_dir)
    assert [row["step"] for row in got] == [1, 2, 3, 4, 5]
    # The resumed process redid exactly the steps after the newest checkpoint, lost ones included.
    assert [row["step"] for row in got if row["time"] > killed_at] == list(range(saved + 1, 6))
    got = without_time(got)
    assert expected[0]["reward"] > 0 and abs(expected[-1][MOVED[name]]) > 0  # policy / critic moved
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in want:
            np.testing.assert_allclose(have[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
    # Control: another learning rate samples the same step 1, then its metrics leave the tolerance.
    other = without_time(model_metrics(tmp_path / "control"))
    assert other[0]["reward"] == expected[0]["reward"]
    moved = [not np.isclose(o[k], e[k], rtol=1e-6, atol=1e-7)
             for o, e in zip(other[1:], expected[1:]) for k in ("reward", MOVED[name])]
    assert any(moved), (other, expected)
