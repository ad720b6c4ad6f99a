"""Held-out evaluation during training (task.eval_every): one eval.jsonl record per
evaluated step whose pass@k curve is the unbiased estimator of its saved per-sample
correctness, eval metrics in metrics.jsonl, the final/best summary, and the plot."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.evaluation import pass_at_k_curve
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.run.plots import plot_pass_at_k
from jaxrl_llm.train.sample.prompts import task_from_config
from tests.train.tiny_run import tiny_config


def odd_length_is_right(completion: str, example) -> float:
    """A grader under which a random tiny model is right about half the time."""
    return float(len(completion) % 2)


def pass_at_k_by_binomials(n: int, c: int, k: int) -> float:
    """1 - C(n - c, k) / C(n, k) with exact integer binomials (Chen et al. 2021)."""
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_eval_every_writes_one_record_per_eval_step_with_the_unbiased_curve(tiny_model_dir, tmp_path, monkeypatch):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=3", "task.eval_every=2", "task.eval_samples=4",
                      "task.eval_size=6")
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(odd_length_is_right))
    out = loop.train(cfg, task=task)

    records = [json.loads(line) for line in (Path(cfg.run_path) / "eval.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [2, 3]  # every 2 steps and the last one
    for r in records:
        correct = np.asarray(r["correct"])
        assert correct.shape == (6, 4)
        want = [np.mean([pass_at_k_by_binomials(4, int(c), k) for c in correct.sum(axis=1)]) for k in range(1, 5)]
        np.testing.assert_allclose(r["pass_at_k"], want, rtol=1e-6, atol=1e-7)
        assert all(a <= b + 1e-7 for a, b in zip(r["pass_at_k"], r["pass_at_k"][1:]))  # monotone in k
        assert r["pass@1"] == pytest.approx(correct.mean(), abs=1e-6)  # pass@1 = the mean correctness
    assert 0 < np.mean([np.asarray(r["correct"]).mean() for r in records]) < 1  # the curve is not trivial

    rows = {row["step"]: row for row in read_metrics(cfg.run_path)}
    assert "eval_pass@1" not in rows[1]
    for r in records:
        assert rows[r["step"]]["eval_pass@1"] == pytest.approx(r["pass@1"])
        assert rows[r["step"]]["eval_pass@4"] == pytest.approx(r["pass_at_k"][-1])
    best = max(records, key=lambda r: (r["pass@1"], -r["step"]))
    assert out.eval_summary["final"]["step"] == 3 and out.eval_summary["best"]["step"] == best["step"]
    assert json.loads((Path(cfg.run_path) / "eval_summary.json").read_text()) == out.eval_summary
    fig = plot_pass_at_k([cfg.run_path], tmp_path / "curve.png")
    assert (tmp_path / "curve.png").stat().st_size > 0 and len(fig.axes[0].lines) == 2


def test_pass_at_k_curve_hand_values():
    # prompt 0: 1 of 4 right: pass@k = k/4; prompt 1: 2 of 4: 1/2, 1 - C(2,2)/C(4,2) = 5/6, 1, 1
    curve = pass_at_k_curve([[1, 0, 0, 0], [1, 1, 0, 0]])
    np.testing.assert_allclose(curve, [(0.25 + 0.5) / 2, (0.5 + 5 / 6) / 2, (0.75 + 1) / 2, 1.0], rtol=1e-6)
