"""Throughput of the code grader: sandboxed executions per second through a GraderPool.

    python -m jaxrl_llm.benchmarks.cpu.code_sandbox [--workers 2] [--batch 64] [--repeats 3]

Grades ``code_from_examples`` reference completions (8 tests each, one sandbox run per
completion) with ``code_reward`` in a pool of ``--workers`` processes; the first batch starts
the workers and is not timed. Prints one JSON line: executions/s per repeat and their median.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from jaxrl_llm.data import make_task
from jaxrl_llm.rewards import GraderPool, code_reward


def measure(workers: int, batch: int, repeats: int) -> dict:
    load_before = os.getloadavg()
    task = make_task("code_from_examples")
    examples = task.examples("train", batch, seed=0)
    completions = [example.answer for example in examples]
    rates = []
    with GraderPool(workers, timeout_s=30) as pool:
        pool.grade(code_reward, completions[:workers], examples[:workers])  # workers up
        for _ in range(repeats):
            started = time.monotonic()
            result = pool.grade(code_reward, completions, examples)
            rates.append(batch / (time.monotonic() - started))
            if result.mean_reward != 1.0:
                raise RuntimeError(f"reference completions failed: {result.errors[:3]}")
    return {"workers": workers, "batch": batch, "executions_per_s": [round(r, 1) for r in rates],
            "median_executions_per_s": round(statistics.median(rates), 1), "cpus": os.cpu_count(),
            "load_average_before": load_before}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.workers, args.batch, args.repeats)))


if __name__ == "__main__":
    main()
