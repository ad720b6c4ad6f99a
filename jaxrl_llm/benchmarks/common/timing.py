"""The benchmarks' one timer (every step called once per round, round after round) and their progress line."""
from __future__ import annotations

import statistics
import time
from typing import Callable


def interleaved_times(steps: dict[str, Callable[[], object]], warmup: int, iters: int) -> dict[str, list[float]]:
    """Seconds of each call of every step (each must block until its result is ready), after
    ``warmup`` untimed rounds. The steps take turns every round, so all of them see the same
    machine load (on a shared machine the load drifts during a run)."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(iters):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def median_seconds(fn: Callable[[], object], iters: int, warmup: int = 1) -> float:
    """Median seconds of fn() (which blocks) over ``iters`` calls after ``warmup`` (the compile)."""
    return statistics.median(interleaved_times({"fn": fn}, warmup, iters)["fn"])


def log(msg: str) -> None:
    """One time-stamped progress line of the accelerator checks, flushed at once."""
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", flush=True)
