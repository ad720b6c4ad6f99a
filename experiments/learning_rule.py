"""The verdict rule of the environment learning runs (issue 62, deliverable 5), fixed before their
deciding runs: experiments/gem_learning.py, verifiers_learning.py and judge_learning.py.

Each run reduces a seed to the change of a quantity over training (its mean over the last
WINDOW steps minus its mean over the first WINDOW steps, or held-out after minus before) and
the rule reads the 95% Student-t interval of that change over the seeds (reports/stats.py):

- a claimed direction ("up" or "down") is *reproduced* when the interval lies wholly on its side of 0;
- *not reproduced* when it lies wholly on the other side, or wholly inside +-MARGIN (an equivalence
  test: a change of MARGIN or more in either direction is excluded);
- *inconclusive* otherwise, and always with fewer than MIN_SEEDS seeds.

A claim of several directions (success up AND format errors down) is reproduced when every one
is, not reproduced when any one is not, and inconclusive otherwise.

The runs also share their config's fixed sections (`learning_config`) and their ending (`conclude`:
the intervals, summary.md and the stored result).
"""
from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple, Sequence

from jaxrl_llm.reports import stats
from jaxrl_llm.train.config import CheckpointConfig, Config, MetricsConfig, ModelConfig

MIN_SEEDS = 3
WINDOW = 3  # steps in the first and in the last window
MARGIN = 0.05  # on a share or a reward in [0, 1]: 5 points
DIRECTIONS = {"up": 1.0, "down": -1.0}


def window_change(per_step: Sequence[float], window: int = WINDOW) -> float:
    """Mean of the last `window` values minus the mean of the first `window` (NaN when fewer than
    2 x window values: the windows would overlap)."""
    values = [float(v) for v in per_step]
    if len(values) < 2 * window:
        return math.nan
    return sum(values[-window:]) / window - sum(values[:window]) / window


def reading(iv: stats.Interval, direction: str, *, margin: float = MARGIN, min_seeds: int = MIN_SEEDS) -> str:
    """The rule's verdict on one change interval claimed to go `direction`."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is invalid; valid: one of {list(DIRECTIONS)}")
    if iv.n < min_seeds or not (math.isfinite(iv.low) and math.isfinite(iv.high)):
        return "inconclusive"
    sign = DIRECTIONS[direction]
    low, high = sorted((sign * iv.low, sign * iv.high))  # the claimed direction made "up"
    if high < 0:
        return "not reproduced"
    if low > 0:
        return "reproduced"
    if -margin < low and high < margin:
        return "not reproduced"
    return "inconclusive"


def combined(readings: Sequence[str]) -> str:
    if readings and all(r == "reproduced" for r in readings):
        return "reproduced"
    return "not reproduced" if "not reproduced" in readings else "inconclusive"


def rule_text(claims: Mapping[str, str]) -> str:
    """VERDICT_RULE's text for {statistic: direction}."""
    parts = "; ".join(f"{key} {direction}" for key, direction in claims.items())
    return (f"per seed the change named; over >= {MIN_SEEDS} seeds its mean and 95% Student-t interval. Claimed: "
            f"{parts}. Each is reproduced if its interval lies wholly on the claimed side of 0, not reproduced if "
            f"wholly on the other side or wholly inside +-{MARGIN:g} (equivalence margin), inconclusive otherwise; "
            "the claim is reproduced if every part is, not reproduced if any part is not, inconclusive otherwise "
            f"(and with fewer than {MIN_SEEDS} seeds)")


def claim_verdict(numbers: Mapping, claims: Mapping[str, str]) -> str:
    """The rule on stored numbers ({statistic: interval dict}) for {statistic: direction}."""
    from jaxrl_llm.reports.results import number

    return combined([reading(number(numbers, key), direction) for key, direction in claims.items()])


def numbers_over_seeds(per_seed: Mapping[int, Mapping[str, float]]) -> tuple[dict, dict]:
    """({statistic: interval over seeds}, {statistic: {seed: value}}) from {seed: {statistic: value}}."""
    from jaxrl_llm.reports.results import interval_of, keyed

    keys = list(next(iter(per_seed.values())))
    by_key = {k: {s: values[k] for s, values in per_seed.items()} for k in keys}
    return {k: interval_of(v).to_dict() for k, v in by_key.items()}, {k: keyed(v) for k, v in by_key.items()}


def no_remarks(numbers: Mapping) -> list[str]:
    return []


class LearningClaim(NamedTuple):
    """What a learning run's stored result says about itself, besides the numbers: written before the run."""
    name: str  # the result's name: experiments/results/<name>.json, its row in the results table
    script: str  # experiments/<script>.py, the command's head
    title: str
    claim: str
    claims: Mapping[str, str]  # {statistic: claimed direction}, what the verdict reads
    verdict_rule: str  # rule_text(claims), plus what else the experiment reports by rule
    statistic: str
    headline: str
    full_seeds: int  # the deciding run's seed count (a --quick summary says when it used fewer)
    interval_method: str = "mean and 95% Student-t over seeds"
    tuning_seeds: tuple[int, ...] = ()
    # what else the experiment reports by rule from the intervals: the stored result's caveats (shown by its verdict)
    remarks: Callable[[Mapping], Sequence[str]] = no_remarks


def learning_config(name: str, seed: int, steps: int, **sections: Any) -> Config:
    """Config(name, seed, run_dir runs/<name>_s<seed>, total_steps) of SmolLM2-135M-Instruct with the sections
    every learning run shares (a checkpoint every 4 steps, the last kept, saved synchronously; progress every
    step; no TensorBoard) and the run's own `sections` (rollout, recipe, train, task)."""
    return Config(name=name, seed=seed, run_dir=f"runs/{name}_s{seed}", total_steps=steps,
                  model=ModelConfig(source="smollm2"),
                  checkpoint=CheckpointConfig(every_steps=4, keep=1, async_save=False),
                  metrics=MetricsConfig(tensorboard=False, progress_every=1), **sections)


def stored_result(claim: LearningClaim, per_seed: Mapping[int, Mapping[str, float]], *, setting: str, command: str,
                  wall_s: float | None, notes: Sequence[str] = ()):
    """The ExperimentResult of {seed: {statistic: value}}: intervals over seeds, `claim`'s verdict by the rule;
    `notes` its notes, `claim.remarks(numbers)` its caveats."""
    from jaxrl_llm.reports.results import ExperimentResult

    numbers, stored = numbers_over_seeds(per_seed)
    return ExperimentResult(
        name=claim.name, title=claim.title, claim=claim.claim, setting=setting, command=command, seeds=tuple(per_seed),
        tuning_seeds=claim.tuning_seeds, statistic=claim.statistic, interval_method=claim.interval_method,
        verdict_rule=claim.verdict_rule, verdict=claim_verdict(numbers, claim.claims), headline=claim.headline,
        numbers=numbers, per_seed=stored, wall_s=wall_s, notes=tuple(notes),
        caveats=tuple(claim.remarks(numbers)))


def conclude(claim: LearningClaim, per_seed: Mapping[int, Mapping[str, float]], *, args: argparse.Namespace,
             argv: Sequence[str] | None, out: Path, config: Config, setting: str, started: float,
             notes: Sequence[str] = ()):
    """The end of every learning run: <out>/summary.md (the intervals, the verdict, the claim's remarks) and, with
    --results, the stored result written there (`setting` prefixed "--quick: " at the reduced size; the
    command as typed; the wall time since `started`, a time.perf_counter())."""
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.runs import write_summary

    command = f"python experiments/{claim.script}.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    result = stored_result(claim, per_seed, setting=("--quick: " if args.quick else "") + setting, command=command,
                           wall_s=time.perf_counter() - started, notes=notes)
    columns = ["statistic", "mean [95% interval] (n)"]
    rows = [{columns[0]: k, columns[1]: stats.format_interval(stats.Interval(**v), signed=" - " in k)}
            for k, v in result.numbers.items()]
    write_summary(out, rows, columns, title=f"{claim.title} ({claim.name})",
                  notes=[stats.seed_note(result.seeds, quick=args.quick, full_seeds=claim.full_seeds),
                         f"verdict by the fixed rule: {result.verdict}", *claim.remarks(result.numbers)],
                  config={"name": claim.name, "seeds": list(result.seeds), "config": config.to_dict()})
    if args.results:
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    return result
