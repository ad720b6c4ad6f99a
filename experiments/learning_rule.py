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
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

from jaxrl_llm.reports import stats

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
