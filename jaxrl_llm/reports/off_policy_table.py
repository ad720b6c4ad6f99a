"""Experiment 10's table: per (max_lag, sampler precision) cell, the off-policy corrections ranked.

Read from the stored result (experiments/results/off_policy.json, written by
experiments/off_policy.py through reports/results.py); rewritten at every finished run and
rerunnable on its own:

    python -m jaxrl_llm.reports.off_policy_table [RESULT.json]   # writes RESULT.md beside it

For each correction: mean held-out end success [95% t interval] (seeds), the paired difference
to `none` and its reading by the experiment's VERDICT_RULE (helps / hurts / equivalent /
inconclusive; computed here from the stored per-seed numbers, the same rule as the file's
`label`), steps to the success threshold, collapsed runs, and mismatch k3 (mean over steps,
mean over seeds; and the largest step value of any seed).
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from jaxrl_llm.reports import stats
from jaxrl_llm.reports.results import RESULTS_DIR

DEFAULT = RESULTS_DIR / "off_policy.json"
COLUMNS = ("rank", "correction", "end success (n)", "- none, paired", "reading", "steps to threshold",
           "collapsed", "k3 mean", "k3 max")


class CellRow(NamedTuple):
    """One correction's line in one cell."""

    correction: str
    end: stats.Interval
    diff: stats.Interval | None  # paired correction - none over the seeds both have; None for none itself
    reading: str
    steps: stats.Interval
    collapsed: int
    runs: int
    k3_mean: float
    k3_max: float


def reading(diff: stats.Interval | None, margin: float) -> str:
    """The verdict rule's label of a paired interval (the experiment file's `label`, restated)."""
    if diff is None:
        return "reference"
    if diff.n < 2 or not math.isfinite(diff.low):
        return "inconclusive"
    if diff.low > 0:
        return "helps"
    if diff.high < 0:
        return "hurts"
    return "equivalent" if -margin <= diff.low and diff.high <= margin else "inconclusive"


def seed_values(per_seed: Mapping[str, Mapping[str, float]], run: str, quantity: str) -> dict[str, float]:
    return dict(per_seed.get(f"{run} {quantity}", {}))


def cell_rows(result: Mapping[str, Any], lag: int, precision: str, corrections: Sequence[str],
              margin: float) -> list[CellRow]:
    """The cell's rows, ranked by mean end success (highest first; ties keep the grid order)."""
    per_seed = result["per_seed"]
    none_end = seed_values(per_seed, f"lag{lag}_{precision}_none", "end_success")
    rows = []
    for c in corrections:
        run = f"lag{lag}_{precision}_{c}"
        end = seed_values(per_seed, run, "end_success")
        if not end:
            continue
        diff = None if c == "none" else stats.interval([v - none_end[s] for s, v in end.items() if s in none_end])
        k3 = list(seed_values(per_seed, run, "k3_mean").values())
        rows.append(CellRow(c, stats.interval(list(end.values())), diff, reading(diff, margin),
                            stats.interval(list(seed_values(per_seed, run, "steps_to_threshold").values())),
                            int(sum(seed_values(per_seed, run, "collapsed").values())), len(end),
                            float(sum(k3) / len(k3)) if k3 else math.nan,
                            max(seed_values(per_seed, run, "k3_max").values(), default=math.nan)))
    return sorted(rows, key=lambda r: -r.end.mean if math.isfinite(r.end.mean) else math.inf)


def grid_of(result: Mapping[str, Any]) -> tuple[list[int], list[str], list[str]]:
    """(lags, precisions, corrections) present in the result's per-run keys, in first-seen order."""
    lags, precisions, corrections = [], [], []
    for key in result["per_seed"]:
        run = key.split(" ", 1)[0]  # lag<L>_<precision>_<correction>
        lag_s, precision, correction = run.split("_", 2)
        for seen, value in ((lags, int(lag_s[3:])), (precisions, precision), (corrections, correction)):
            if value not in seen:
                seen.append(value)
    return sorted(lags), precisions, corrections


def fmt(x: float, spec: str = ".3g") -> str:
    return "-" if x is None or not math.isfinite(x) else format(x, spec)


def cell_table(rows: Sequence[CellRow]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for rank, r in enumerate(rows, 1):
        diff = "-" if r.diff is None else stats.format_interval(r.diff, signed=True)
        lines.append("| " + " | ".join([
            str(rank), f"`{r.correction}`", stats.format_interval(r.end), diff, r.reading,
            stats.format_interval(r.steps), f"{r.collapsed} of {r.runs}", fmt(r.k3_mean), fmt(r.k3_max)]) + " |")
    return "\n".join(lines)


def markdown(result: Mapping[str, Any], margin: float) -> str:
    """The whole page: provenance, the rules, then one ranked table per cell."""
    machine = result.get("machine") or {}
    lags, precisions, corrections = grid_of(result)
    head = [f"# Experiment 10: {result['title']}", "",
            "Written by `python -m jaxrl_llm.reports.off_policy_table` from the result JSON of the same name beside "
            "it (do not edit).", "",
            f"* claim: {result['claim']}", f"* verdict on the claim: **{result['verdict']}**",
            f"* setting: {result['setting']}", f"* command: `{result['command']}`",
            f"* seeds: {', '.join(str(s) for s in result['seeds'])} (tuning seed(s) "
            f"{', '.join(str(s) for s in result.get('tuning_seeds', [])) or 'none'}, not counted)",
            f"* rule (fixed before the run): {result['verdict_rule']}",
            f"* commit {str(result.get('commit'))[:7]}{' (dirty)' if result.get('dirty') else ''}, "
            f"{result.get('date', '')}, {machine.get('cpu', '')}, {machine.get('cores', '')} cores, load average "
            f"{machine.get('load_average', '')}; wall time {fmt(result.get('wall_s') or math.nan, '.0f')} s",
            *[f"* {n}" for n in result.get("notes", [])], ""]
    body = []
    for lag in lags:
        for p in precisions:
            rows = cell_rows(result, lag, p, corrections, margin)
            if rows:
                body += [f"## max_lag {lag}, sampler {p}", "", cell_table(rows), ""]
    return "\n".join(head + body)


def write_table(result_path: str | Path = DEFAULT, margin: float | None = None) -> Path:
    """Writes <result>.md beside the result JSON; `margin` defaults to the experiment file's MARGIN."""
    path = Path(result_path)
    if margin is None:
        from jaxrl_llm.reports.results import experiment_module

        margin = experiment_module("off_policy").MARGIN
    out = path.with_suffix(".md")
    out.write_text(markdown(json.loads(path.read_text()), margin))
    return out


if __name__ == "__main__":
    print(f"wrote {write_table(*(sys.argv[1:2] or [DEFAULT]))}")
