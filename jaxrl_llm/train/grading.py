"""Grading a step's samples: the task's rewards per group (`grade`, in the grader pool), what
the learner gets from them (`Graded`), and the response metrics every step logs."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_llm.data import Example, Task
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.rollout.types import RolloutBatch


@dataclasses.dataclass(frozen=True)
class Graded:
    """The rewards of a batch of P prompts x G samples and what went wrong computing them."""

    rewards: np.ndarray  # [P, G] float32; 0 where a grader failed
    errors: int  # graders that raised or returned a bad value
    timeouts: int  # graders stopped at the deadline
    wall_s: float
    sampling: dict[str, float] = dataclasses.field(default_factory=dict)  # e.g. dynamic sampling's metrics
    shaped: np.ndarray | None = None  # [P, G] the learner's rewards after shaping (None: `rewards`)
    advantages: np.ndarray | None = None  # [N, T_c] VinePPO's Monte-Carlo advantages (train/vineppo_step.py)

    @property
    def learner_rewards(self) -> np.ndarray:
        return self.rewards if self.shaped is None else self.shaped


def grade(pool: GraderPool, task: Task, texts: Sequence[str], examples: Sequence[Example],
          group_size: int) -> Graded:
    """Grades texts (prompt-major: G per example) with the task's reward function."""
    expanded = [e for e in examples for _ in range(group_size)]
    result = pool.grade(task.reward_fn, list(texts), expanded)
    rewards = np.asarray(result.rewards, np.float32).reshape(len(examples), group_size)
    return Graded(rewards, result.n_errors, result.n_timeouts, result.wall_s)


def response_metrics(task: Task, rewards: np.ndarray, rollouts: RolloutBatch) -> dict[str, float]:
    """Reward, pass rate (the task's notion of correct) and lengths of correct/incorrect answers."""
    lengths = np.array([r.num_completion_tokens for r in rollouts.records], np.float32)
    flat = rewards.reshape(-1)
    correct = task.is_correct(flat)
    out = {"reward": float(flat.mean()), "pass_rate": float(correct.mean()),
           "length_mean": float(lengths.mean()),
           "truncated_fraction": float(np.mean([r.finish_reason != "stop" for r in rollouts.records]))}
    out["length_correct"] = float(lengths[correct].mean()) if correct.any() else float("nan")
    out["length_incorrect"] = float(lengths[~correct].mean()) if (~correct).any() else float("nan")
    return out
