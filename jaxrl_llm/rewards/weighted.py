"""Several graders as one reward: `WeightedRewards` (task.reward_fns with task.reward_weights).

Called like any grader it returns the weighted sum sum_k w_k r_k, so every part of the run that
wants one reward per answer (the pass rate, evaluation, VinePPO's continuations) takes it as is;
the RL loop's grading (train/sample/grading.py) calls each part separately and keeps each reward by its
name, which GDPO (core/multi_reward.py) normalises within its group before summing. A run with
one grader is the one-part case (`reward_parts`): name "reward", weight 1.
"""
from __future__ import annotations

import dataclasses

from jaxrl_llm.rewards.graders import RewardFn


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


def reward_parts(reward_fn: RewardFn) -> WeightedRewards:
    """The graders of `reward_fn`: its parts, or itself as the one part "reward" with weight 1."""
    if isinstance(reward_fn, WeightedRewards):
        return reward_fn
    return WeightedRewards(("reward",), (reward_fn,), (1.0,))
