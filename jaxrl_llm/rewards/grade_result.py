"""One batch's grading outcome (:class:`GradeResult`) and how it is gathered answer by answer:
finite real rewards only, clipped into the grader's ``reward_range``, suspected forgeries counted."""
from __future__ import annotations

import dataclasses
import math
import numbers
import time
from typing import Any, Callable

from jaxrl_llm.rewards.pool_worker import ERROR, OK, TIMEOUT, Suspected

RewardFn = Callable[[str, Any], float]


@dataclasses.dataclass(frozen=True)
class GradeResult:
    """Rewards of one batch and what went wrong while computing them.

    rewards:    one float per completion, 0.0 where grading failed.
    statuses:   one of "ok", "error", "timeout" per completion.
    n_errors:   graders that raised, returned a bad value, or lost their worker.
    n_timeouts: graders stopped at the deadline.
    errors:     one message per error or timeout, naming the completion index, in index order.
    wall_s:     wall time of the whole batch.
    n_forgery_suspected: answers whose grader returned :class:`Suspected`, or a reward outside
                the grader's ``reward_range`` (clipped into it).
    suspicions: one message per such answer, naming the completion index, in index order.
    metrics:    a grader's own counts for the step's metrics (the LLM judge's judge_calls, ...).
    """

    rewards: tuple[float, ...]
    statuses: tuple[str, ...]
    n_errors: int
    n_timeouts: int
    errors: tuple[str, ...]
    wall_s: float
    n_forgery_suspected: int = 0
    suspicions: tuple[str, ...] = ()
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards) / len(self.rewards) if self.rewards else 0.0


def summed_metrics(results) -> dict[str, float]:
    """The GradeResult.metrics of several results, summed by name (a count of 0 stays)."""
    total: dict[str, float] = {}
    for result in results:
        for name, value in result.metrics.items():
            total[name] = total.get(name, 0.0) + value
    return total


class Collector:
    """Accumulates per-answer outcomes into a GradeResult."""

    def __init__(self, n: int, reward_range: tuple[float, float] | None = None):
        self.rewards = [0.0] * n
        self.statuses = [""] * n
        self.errors: list[tuple[int, str]] = []
        self.suspicions: list[tuple[int, str]] = []
        self.reward_range = reward_range
        self.started = time.monotonic()

    def ok(self, index: int, value: Any) -> None:
        if isinstance(value, Suspected):
            self.suspicions.append((index, f"completion {index}: {value.reason}"[:500]))
            value = value.reward
        reward, problem = _checked_reward(value)
        if problem is not None:
            self.error(index, problem)
            return
        low, high = self.reward_range or (-math.inf, math.inf)
        if not low <= reward <= high:
            self.suspicions.append((index, f"completion {index}: reward {reward:g} outside the grader's range "
                                           f"[{low:g}, {high:g}], clipped"))
            reward = min(max(reward, low), high)
        self.rewards[index] = reward
        self.statuses[index] = OK

    def error(self, index: int, message: str) -> None:
        self.statuses[index] = ERROR
        self.errors.append((index, f"completion {index}: {message}"))

    def timeout(self, index: int, timeout_s: float) -> None:
        self.grader_timeout(index, f"grader ran past {timeout_s:g} s, worker killed")

    def grader_timeout(self, index: int, message: str) -> None:
        """A timeout the grader reported itself (:class:`GraderTimeout`)."""
        self.statuses[index] = TIMEOUT
        self.errors.append((index, f"completion {index}: {message}"))

    def result(self) -> GradeResult:
        return GradeResult(
            rewards=tuple(self.rewards),
            statuses=tuple(self.statuses),
            n_errors=self.statuses.count(ERROR),
            n_timeouts=self.statuses.count(TIMEOUT),
            # by completion index, whatever order the workers finished in
            errors=tuple(message for _, message in sorted(self.errors)),
            wall_s=time.monotonic() - self.started,
            n_forgery_suspected=len({index for index, _ in self.suspicions}),
            suspicions=tuple(message for _, message in sorted(self.suspicions)),
        )


def _checked_reward(value: Any) -> tuple[float, str | None]:
    """(reward, None) for a finite real number, else (0.0, what was wrong)."""
    if not isinstance(value, numbers.Real):
        return 0.0, f"grader returned {type(value).__name__} {value!r:.80}, expected a float"
    reward = float(value)
    if not math.isfinite(reward):
        return 0.0, f"grader returned non-finite reward {reward}"
    return reward, None


def reward_range_of(reward_fn: RewardFn) -> tuple[float, float] | None:
    """The grader's documented reward range (its ``reward_range`` attribute), or None."""
    bounds = getattr(reward_fn, "reward_range", None)
    if bounds is None:
        return None
    if (not isinstance(bounds, tuple) or len(bounds) != 2 or not all(isinstance(b, numbers.Real) for b in bounds)
            or not bounds[0] <= bounds[1]):
        raise ValueError(f"reward_range of {reward_fn!r} must be a (low, high) pair of numbers with low <= high, "
                         f"got {bounds!r}")
    return float(bounds[0]), float(bounds[1])
