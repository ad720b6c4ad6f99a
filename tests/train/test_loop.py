"""The RL loop end to end on a tiny random decoder with SmolLM2's real tokenizer
and chat template (fast), through the deterministic, seeded JAX sampler:
crash-and-resume exactness, failing graders, unreachable servers, config errors."""
import json
import signal
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.sample import stage as sampling
from jaxrl_llm.train.run.evaluation import evaluate_params
from jaxrl_llm.train.policy import load_policy
from jaxrl_llm.train.sample.prompts import task_from_config
from jaxrl_llm.train.run.run_state import restore_params
from jaxrl_llm.train.config import ConfigError, replace_values
from jaxrl_llm.train.run.metrics import read_metrics
from tests.train.tiny_run import REPO, TINY_OVERRIDES, model_metrics, raises_or_hangs, run_cli, tiny_config



@pytest.mark.slow  # ~1 min; the learning resume test in test_resume_learning.py runs in make test
def test_kill_9_then_resume_is_exact_with_dynamic_sampling_and_eval_every(tiny_model_dir, tmp_path):
    """DAPO's dynamic sampling (extra rounds, all seeded by (seed, step, round)) and held-out
    evaluation every 2 steps survive a kill -9: metrics and eval.jsonl equal the uninterrupted
    run's. (That a resume restores learning state exactly is tested on a run that learns in
    tests/train/test_resume_learning.py.)"""
    extra = ["recipe.name=dapo", "rollout.dynamic_sampling_rounds=2", "task.eval_every=2"]
    common = ["--config", str(REPO / "experiments/demo.py"), *TINY_OVERRIDES, f"model.source={tiny_model_dir}", *extra]
    straight = run_cli("train", *common, f"run_dir={tmp_path / 'straight'}")
    assert straight.wait(timeout=600) == 0, straight.stdout.read()

    crashed_dir = tmp_path / "crashed"
    victim = run_cli("train", *common, f"run_dir={crashed_dir}")
    metrics_file = crashed_dir / "metrics.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline:  # kill -9 once step 2 is logged (its checkpoint may be in flight)
        if metrics_file.exists() and len(metrics_file.read_text().splitlines()) >= 2:
            break
        assert victim.poll() is None, victim.stdout.read()
        time.sleep(0.2)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    resumed = run_cli("train", *common, f"run_dir={crashed_dir}", "--resume")
    assert resumed.wait(timeout=600) == 0, resumed.stdout.read()

    expected, got = model_metrics(tmp_path / "straight"), model_metrics(crashed_dir)
    assert [row["step"] for row in got] == [1, 2, 3, 4]
    for want, have in zip(expected, got):
        assert want.keys() == have.keys()
        for key in want:
            np.testing.assert_allclose(have[key], want[key], rtol=1e-6, atol=1e-7, err_msg=key)
    evals = [[json.loads(line) for line in (d / "eval.jsonl").read_text().splitlines()]
             for d in (tmp_path / "straight", crashed_dir)]
    assert [r["step"] for r in evals[1]] == [2, 4]  # one record per evaluated step, as uninterrupted
    assert evals[0] == evals[1]
    assert all(row["dynamic_sampling_rounds"] == 2.0 for row in got)  # a random model: no group kept


def test_failing_and_hanging_graders_score_zero_are_logged_and_the_run_goes_on(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=2", "task.reward_timeout_s=1.0")
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(raises_or_hangs))
    n = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    texts = ["boom", "hang", "right"] + ["wrong"] * (n - 3)
    monkeypatch.setattr(sampling, "decode_completions", lambda policy, rollouts: texts)
    out = loop.train(cfg, task=task)
    assert out.step == 2
    for row in read_metrics(cfg.run_path):
        assert row["reward_errors"] == 1.0 and row["reward_timeouts"] == 1.0
        assert row["reward"] == pytest.approx(1.0 / n)  # only "right" scores; boom and hang count 0


def test_unreachable_vllm_server_is_refused_before_the_run_and_keeps_the_checkpoint(tiny_model_dir, tmp_path, caplog):
    """rollout.server_urls naming a server that does not answer: a ConfigError naming the field and
    the URL before any model loads or checkpoint is restored (a server that dies mid-run:
    tests/rollout/test_server_faults.py); the checkpoint is untouched and still restores."""
    from jaxrl_llm.train.config import ConfigError

    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=1")
    loop.train(cfg)
    ckpt_files = sorted(p.relative_to(cfg.checkpoint_path) for p in Path(cfg.checkpoint_path).rglob("*"))
    broken = replace_values(cfg, {"total_steps": 2, "rollout.engine": "vllm",
                                  "rollout.server_urls": ("http://127.0.0.1:9",)})
    with caplog.at_level("INFO", logger="jaxrl_llm"), pytest.raises(
            ConfigError, match=r"rollout.server_urls: http://127.0.0.1:9 does not answer GET /health"):
        loop.train(broken, resume=True)
    assert not [r for r in caplog.records if r.getMessage().startswith("resumed")]  # refused before resuming
    assert sorted(p.relative_to(cfg.checkpoint_path) for p in Path(cfg.checkpoint_path).rglob("*")) == ckpt_files
    step, _ = restore_params(cfg, load_policy(cfg.model.source))
    assert step == 1


def test_training_moves_the_policy_and_eval_reports_pass_at_k(tiny_model_dir, tmp_path, monkeypatch):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=2")
    policy = load_policy(cfg.model.source)
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(raises_or_hangs))  # 1.0 for "right"
    real_decode = sampling.decode_completions
    # a random tiny model never answers right: grade alternate samples as right so advantages are non-zero
    monkeypatch.setattr(sampling, "decode_completions",
                        lambda policy, rollouts: ["right", "wrong"] * (len(rollouts) // 2))
    out = loop.train(cfg, policy=policy, task=task)
    monkeypatch.setattr(sampling, "decode_completions", real_decode)
    moved = jax.tree.map(lambda a, b: float(np.max(np.abs(np.asarray(a) - np.asarray(b)))),
                         out.state.params, policy.params)
    assert max(jax.tree.leaves(moved)) > 0
    rows = read_metrics(cfg.run_path)
    assert [r["weight_version"] for r in rows] == [0.0, 1.0]  # step 2 sampled from the synced weights
    result = evaluate_params(cfg, policy, out.state.params, step=2, task=task)
    assert set(result) == {"pass@1", "pass@2", "avg@2", "pass_at_k", "correct", "distinct_correct", "num_prompts",
                           "examples"}
    assert result["num_prompts"] == 4 and np.asarray(result["correct"]).shape == (4, 2)
    assert len(result["examples"]) == 3 and all(set(e) == {"prompt", "completion", "reward"} for e in result["examples"])
    assert 0.0 <= result["pass@1"] <= result["pass@2"] <= 1.0
    logged = [json.loads(line) for line in (Path(cfg.run_path) / "eval.jsonl").read_text().splitlines()]
    assert logged[-1]["step"] == 2
    info = json.loads((Path(cfg.run_path) / "run_info.json").read_text())
    assert info["config"]["recipe"]["name"] == "dr_grpo"


def test_resume_without_checkpoint_and_fresh_run_over_checkpoints_are_errors(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=1")
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        loop.train(cfg, resume=True)
    loop.train(cfg)
    with pytest.raises(FileExistsError, match="--resume"):
        loop.train(cfg)


def test_config_errors_name_the_field(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="train.lrr"):
        tiny_config(tiny_model_dir, tmp_path, "train.lrr=1")
    with pytest.raises(ConfigError, match="rollout.max_tokens"):
        tiny_config(tiny_model_dir, tmp_path, "rollout.max_tokens=-3")
