"""Asynchronous vs synchronous rollouts: the same `jaxrl train` run once per max_lag.

    python -m jaxrl_llm.benchmarks.cpu.async_vs_sync --config EXP.py --max-lag 0 1 -- overrides...

Each run gets a fresh temporary run directory (no checkpoints, no TensorBoard) and the
policy is loaded once for all of them. One JSON line per run: the wall time, the steady
state (steps 2.., step 1 compiles the learner and the sampler), the learner's idle
time (wait_s), the summed learn and rollout times, the staleness per step and the sample
ledger. max_lag 0 is synchronous; list lags twice (0 1 0 1) to interleave repeats.
See launch/README.md ("Asynchronous rollouts") for a measurement.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from typing import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.train.config import load_config, replace_values
    from jaxrl_llm.train.run.loop import train
    from jaxrl_llm.train.run.metrics import read_metrics
    from jaxrl_llm.train.policy import load_policy

    parser = argparse.ArgumentParser(
        description="The same `jaxrl train` run once per --max-lag value (0 = synchronous), with its wall time.")
    parser.add_argument("--config", required=True, help="experiment config file, as for `jaxrl train`")
    parser.add_argument("--max-lag", type=int, nargs="+", default=[0, 1], help="rollout.max_lag of each run")
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. total_steps=5")
    args = parser.parse_args(argv)
    cfg = load_config(args.config, args.overrides)
    policy = load_policy(cfg.model.source)
    for lag in args.max_lag:
        with tempfile.TemporaryDirectory() as tmp:
            run = replace_values(cfg, {"rollout.max_lag": lag, "run_dir": tmp, "checkpoint.every_steps": 0,
                                       "metrics.tensorboard": False})
            start = time.perf_counter()
            out = train(run, policy=policy)
            wall = time.perf_counter() - start
            hist = read_metrics(tmp)
        print(json.dumps({"max_lag": lag, "steps": out.step, "wall_s": round(wall, 3),
                          "steady_s": round(sum(h["time_step_s"] for h in hist[1:]), 3),
                          "learn_s": round(sum(h["time_learn_s"] for h in hist), 3),
                          "wait_s": round(sum(h["time_wait_s"] for h in hist), 3),
                          "rollout_s": round(sum(h["time_rollout_s"] for h in hist), 3),
                          "staleness": [h["staleness"] for h in hist], "ledger": out.ledger}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
