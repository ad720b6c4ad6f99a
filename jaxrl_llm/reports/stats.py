"""Across-seed summaries for the experiments: mean, 95% interval and seed count.

Every experiment that runs several seeds reduces each seed to one number per
quantity (e.g. the change in mean length over training) and reports
`interval(values)`: the mean with a Student-t confidence interval
(mean +- t_{0.975, n-1} s / sqrt(n)), which is exact for normally distributed
per-seed values and what a handful of seeds supports; `bootstrap_interval` is
the percentile bootstrap (Efron & Tibshirani 1993, ch. 13) for a check without
the normality assumption; `log_interval` is the interval for ratios, taken on the log
scale. With one seed there is no interval: low = high = nan,
and the formatted value says "1 seed".
"""
from __future__ import annotations

import math
from typing import NamedTuple, Sequence

import numpy as np


class Interval(NamedTuple):
    mean: float
    low: float
    high: float
    n: int  # seeds (finite values) behind the interval

    def excludes_zero(self) -> bool:
        """True when the whole interval is on one side of 0 (a direction the seeds agree on)."""
        return self.n > 1 and (self.low > 0 or self.high < 0)

    def to_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}


def _finite(values: Sequence[float]) -> np.ndarray:
    array = np.asarray([float(v) for v in values], np.float64)
    return array[np.isfinite(array)]


def interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of the finite `values` with its two-sided Student-t interval at `level`."""
    if not 0 < level < 1:
        raise ValueError(f"level={level!r} is invalid; valid: 0 < level < 1")
    x = _finite(values)
    n = int(x.size)
    if n == 0:
        return Interval(math.nan, math.nan, math.nan, 0)
    mean = float(x.mean())
    if n == 1:
        return Interval(mean, math.nan, math.nan, 1)
    from scipy import stats

    half = float(stats.t.ppf(0.5 + level / 2, n - 1)) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def log_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Geometric mean of positive `values` (ratios) with the Student-t interval of their
    logarithms, exponentiated: a ratio's interval stays above 0 and is symmetric in
    ratio and inverse (a 10x and a 0.1x seed cancel). Non-positive values are refused."""
    x = _finite(values)
    if np.any(x <= 0):
        raise ValueError(f"log_interval needs positive ratios; got {[float(v) for v in x if v <= 0]}")
    logs = interval(np.log(x), level)
    return Interval(*(math.exp(v) for v in logs[:3]), logs.n)


def bootstrap_interval(values: Sequence[float], level: float = 0.95, *, resamples: int = 10_000,
                       seed: int = 0) -> Interval:
    """Mean of the finite `values` with the percentile-bootstrap interval of the mean."""
    x = _finite(values)
    n = int(x.size)
    if n < 2:
        return interval(x, level)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    low, high = np.quantile(means, [0.5 - level / 2, 0.5 + level / 2])
    return Interval(float(x.mean()), float(low), float(high), n)


def t_test_power(n: int, effect: float, sd: float, level: float = 0.95) -> float:
    """Power of the two-sided one-sample (paired) t-test at `level` with `n` seeds when the true
    mean difference is `effect` and the per-seed sd is `sd`: P(|T| > t_{(1+level)/2, n-1}) with T
    noncentral t, n - 1 degrees of freedom, noncentrality effect sqrt(n) / sd. The chance that
    `interval` over n seeds excludes 0."""
    if n < 2 or sd <= 0:
        raise ValueError(f"n={n!r}, sd={sd!r} is invalid; valid: n >= 2 seeds and sd > 0")
    from scipy import stats

    crit = float(stats.t.ppf(0.5 + level / 2, n - 1))
    nc = effect * math.sqrt(n) / sd
    return float(stats.nct.sf(crit, n - 1, nc) + stats.nct.cdf(-crit, n - 1, nc))


def seeds_for_power(effect: float, sd: float, power: float = 0.8, level: float = 0.95,
                    max_seeds: int = 1000) -> int:
    """The fewest paired seeds (>= 2) whose `t_test_power` reaches `power`."""
    if not 0 < power < 1 or effect == 0:
        raise ValueError(f"power={power!r}, effect={effect!r} is invalid; valid: 0 < power < 1, effect != 0")
    for n in range(2, max_seeds + 1):
        if t_test_power(n, effect, sd, level) >= power:
            return n
    raise ValueError(f"more than max_seeds={max_seeds} seeds needed for effect {effect} at sd {sd}")


def format_interval(iv: Interval, digits: int = 3, *, signed: bool = False) -> str:
    """'m [lo, hi] (n = k)' for a table cell; a single seed is marked as such."""
    fmt = f"{{:{'+' if signed else ''}.{digits}g}}"
    if iv.n == 0:
        return "nan"
    if iv.n == 1:
        return f"{fmt.format(iv.mean)} (1 seed, no interval)"
    return f"{fmt.format(iv.mean)} [{fmt.format(iv.low)}, {fmt.format(iv.high)}] (n = {iv.n})"


def seed_note(seeds: Sequence[int], *, quick: bool, full_seeds: int) -> str:
    """The line each summary carries about its seeds (the --quick size may use fewer)."""
    text = f"seeds: {len(seeds)} ({', '.join(str(s) for s in seeds)}); intervals: mean and 95% Student-t over seeds"
    if quick and len(seeds) < full_seeds:
        text += f"; --quick uses {len(seeds)} of the full size's {full_seeds} seeds"
    return text


def parse_seeds(text: str | None, default: Sequence[int]) -> tuple[int, ...]:
    """--seeds "0,1,2" -> (0, 1, 2); None -> `default`."""
    if text is None:
        return tuple(default)
    try:
        seeds = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        seeds = ()
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"--seeds {text!r} is invalid; valid: distinct integers separated by commas, e.g. 0,1,2")
    return seeds
