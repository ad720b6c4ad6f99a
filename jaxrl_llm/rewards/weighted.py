"""Several graders as one reward: `WeightedRewards` (task.reward_fns with task.reward_weights).

Called like any grader it returns the weighted sum sum_k w_k r_k, so every part of the run that
wants one reward per answer (the pass rate, evaluation, VinePPO's continuations) takes it as is;
the RL loop's grading (train/sample/grading.py) calls each part separately and keeps each reward by its
name, which GDPO (core/multi_reward.py) normalises within its group before summing. A run with
one grader is the one-part case (`reward_parts`): name "reward", weight 1.

With a part that grades whole batches in this process (the LLM judge, rewards/judge.py), the
weighted sum is graded a batch at a time too (`grade_batch`): each part through the pool, as
the RL loop's grading does, combined answer by answer.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from jaxrl_llm.rewards.grade_result import GradeResult, summed_metrics
from jaxrl_llm.rewards.graders import RewardFn
from jaxrl_llm.rewards.judge import grades_in_batches


@dataclasses.dataclass(frozen=True)
class WeightedRewards:
    """Graders `fns` named `names`, combined with `weights` (one each)."""

    names: tuple[str, ...]
    fns: tuple[RewardFn, ...]
    weights: tuple[float, ...]

    def __post_init__(self):
        if not self.names or not len(self.names) == len(self.fns) == len(self.weights):
            raise ValueError(f"{len(self.names)} names, {len(self.fns)} graders and {len(self.weights)} weights; "
                             "valid: one name and one weight per grader, at least one grader")
        if len(set(self.names)) != len(self.names):
            raise ValueError(f"grader names {self.names} repeat; valid: distinct names")

    def __call__(self, completion: str, example) -> float:
        return float(sum(w * float(fn(completion, example)) for w, fn in zip(self.weights, self.fns)))

    @property
    def trusted_in_process(self) -> bool:
        """In-process grading (GraderPool) only when every part is trusted there."""
        return all(getattr(fn, "trusted_in_process", False) for fn in self.fns)

    @property
    def grades_in_batches(self) -> bool:
        return any(grades_in_batches(fn) for fn in self.fns)

    def grade_batch(self, pool, completions: Sequence[str], examples: Sequence[Any]) -> GradeResult:
        """The weighted sum graded part by part through `pool` (a GraderPool): an answer whose part
        failed gets 0 from that part and counts once as an error (or a timeout)."""
        return combine_results([pool.grade(fn, completions, examples) for fn in self.fns], self.weights)


def combine_results(results: Sequence[GradeResult], weights: Sequence[float]) -> GradeResult:
    """The GradeResult of sum_k weights[k] * results[k].rewards: per answer the first failed part's status,
    the parts' messages in order; wall times, suspected forgeries and metrics summed."""
    n = len(results[0].rewards)
    statuses = [next((r.statuses[i] for r in results if r.statuses[i] != "ok"), "ok") for i in range(n)]
    return GradeResult(
        rewards=tuple(float(sum(w * r.rewards[i] for w, r in zip(weights, results))) for i in range(n)),
        statuses=tuple(statuses), n_errors=statuses.count("error"), n_timeouts=statuses.count("timeout"),
        errors=tuple(m for r in results for m in r.errors), wall_s=sum(r.wall_s for r in results),
        n_forgery_suspected=sum(r.n_forgery_suspected for r in results),
        suspicions=tuple(m for r in results for m in r.suspicions), metrics=summed_metrics(results))


def reward_parts(reward_fn: RewardFn) -> WeightedRewards:
    """The graders of `reward_fn`: its parts, or itself as the one part "reward" with weight 1."""
    if isinstance(reward_fn, WeightedRewards):
        return reward_fn
    return WeightedRewards(("reward",), (reward_fn,), (1.0,))
