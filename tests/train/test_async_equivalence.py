"""rollout.max_lag = 0 through the asynchronous producer is the synchronous loop: on a run
that learns (tests/train/learning_setup.py), `loop.train` and the plain loop written out in
`reference_sync_loop` give the same per-step metrics and final parameters. Control: with
max_lag = 1 the same run trains on stale batches and ends elsewhere."""
from __future__ import annotations

import numpy as np
import pytest

from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.metrics import read_metrics
from tests.train.learning_setup import SpacesTask, flat_params, learning_config, reference_sync_loop

STEPS = 5
COMPARED = ("reward", "loss", "grad_norm", "entropy", "mismatch_k1")


def test_max_lag_0_through_the_producer_equals_the_plain_synchronous_loop(learning_model_dir, learning_policy,
                                                                          tmp_path):
    cfg = learning_config(learning_model_dir, tmp_path / "lag0", f"total_steps={STEPS}", "checkpoint.every_steps=0")
    reference, reference_params = reference_sync_loop(cfg, learning_policy, SpacesTask())
    rewards = [r["reward"] for r in reference]
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.15, rewards  # it learns

    out = loop.train(cfg, task=SpacesTask(), policy=learning_policy)
    rows = read_metrics(cfg.run_path)
    assert [r["staleness"] for r in rows] == [0.0] * STEPS
    for want, have in zip(reference, rows, strict=True):
        for key in COMPARED:
            assert have[key] == pytest.approx(want[key], rel=1e-6, abs=1e-7), (want["step"], key)
    diff = float(np.max(np.abs(flat_params(out.params) - flat_params(reference_params))))
    assert diff <= 1e-6, diff

    # control: stale batches (max_lag = 1) change the run
    lag1_cfg = learning_config(learning_model_dir, tmp_path / "lag1", f"total_steps={STEPS}",
                               "checkpoint.every_steps=0", "rollout.max_lag=1")
    lag1 = loop.train(lag1_cfg, task=SpacesTask(), policy=learning_policy)
    assert [r["staleness"] for r in read_metrics(lag1_cfg.run_path)] == [0.0] + [1.0] * (STEPS - 1)
    assert float(np.max(np.abs(flat_params(lag1.params) - flat_params(reference_params)))) > 1e-3
