"""Grading a step's samples: the task's rewards per group (`grade`, in the grader pool), what
the learner gets from them (`Graded`, and its part of the step's `core.StepInputs`), and the
response metrics every step logs."""
from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import Example, Task
from jaxrl_llm.rewards import GraderPool, reward_parts
from jaxrl_llm.rewards.grade_result import summed_metrics
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
    # [P, G] each grader's reward by its name (task.reward_fns; one grader: {"reward": rewards})
    parts: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # The recipe's estimator's extra inputs by the names in its `inputs` (core.StepInputs.extras), as
    # the sampling mode filled them: ReMax's "baseline_rewards" [P] (stage.greedy_baseline), VinePPO's
    # "advantages" [N, T_c] (vineppo_step), the others from EXTRA_INPUTS (sample/extras.py).
    extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)
    # answers whose grader suspected a forged reward (GradeResult.n_forgery_suspected: a reward
    # outside the grader's range, clipped; a program returning non-plain data), counted, not failed
    forgery_suspected: int = 0
    # graders' own counts (GradeResult.metrics, e.g. the LLM judge's judge_calls), summed over the graders
    grader_metrics: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def learner_rewards(self) -> np.ndarray:
        return self.rewards if self.shaped is None else self.shaped

    @property
    def judged(self) -> np.ndarray:
        """[P, G] what the task's notion of correct judges: the first grader's reward (several
        task.reward_fns: e.g. correctness first, then format or length), else the reward."""
        return next(iter(self.parts.values())) if self.parts else self.rewards

    def step_inputs(self, is_correct) -> core.StepInputs:
        """The sampling stage's part of the step's `core.StepInputs`: the learner's rewards, the
        task's verdicts (`is_correct`) on the judged rewards, and the estimator's extras; the
        learner adds its own (mask, pi_old, ...) in `learn`."""
        return core.StepInputs(self.learner_rewards, correct=is_correct(self.judged), extras=dict(self.extras))

    def part_metrics(self) -> dict[str, float]:
        """`reward_<name>`: the mean of each named grader's reward (several task.reward_fns), and the
        graders' own counts (`grader_metrics`)."""
        return {**{f"reward_{name}": float(np.mean(r)) for name, r in self.parts.items() if name != "reward"},
                **self.grader_metrics}


def grade(pool: GraderPool, task: Task, texts: Sequence[str], examples: Sequence[Example],
          group_size: int) -> Graded:
    """Grades texts (prompt-major: G per example) with each of the task's graders (`reward_parts`:
    task.reward_fns, or its one reward function); the reward is their weighted sum."""
    expanded = [e for e in examples for _ in range(group_size)]
    graders = reward_parts(task.reward_fn)
    results = [pool.grade(fn, list(texts), expanded) for fn in graders.fns]
    parts = {name: np.asarray(r.rewards, np.float32).reshape(len(examples), group_size)
             for name, r in zip(graders.names, results)}
    rewards = sum(np.float32(w) * r for w, r in zip(graders.weights, parts.values()))
    return Graded(rewards.astype(np.float32), sum(r.n_errors for r in results), sum(r.n_timeouts for r in results),
                  sum(r.wall_s for r in results), parts=parts,
                  forgery_suspected=sum(r.n_forgery_suspected for r in results),
                  grader_metrics=summed_metrics(results))


def learner_rollouts(rollouts: RolloutBatch, graded: Graded) -> RolloutBatch:
    """The rows the learner trains on: the first G = graded.rewards.shape[1] samples of each
    group (ReMax's greedy row, drawn last in each group, only gives the baseline)."""
    group = graded.rewards.shape[1]
    if rollouts.samples_per_prompt == group:
        return rollouts
    records = [r for r in rollouts.records if r.sample_index < group]
    return RolloutBatch(tuple(records), rollouts.num_prompts, group)


def response_metrics(task: Task, rewards: np.ndarray, rollouts: RolloutBatch,
                     judged: np.ndarray | None = None) -> dict[str, float]:
    """Reward, pass rate (the task's notion of correct, of `judged`: `Graded.judged`, default the
    rewards) and lengths of correct/incorrect answers."""
    lengths = np.array([r.num_completion_tokens for r in rollouts.records], np.float32)
    flat = rewards.reshape(-1)
    correct = task.is_correct((rewards if judged is None else judged).reshape(-1))
    out = {"reward": float(flat.mean()), "pass_rate": float(correct.mean()),
           "length_mean": float(lengths.mean()),
           "truncated_fraction": float(np.mean([r.finish_reason != "stop" for r in rollouts.records]))}
    out["length_correct"] = float(lengths[correct].mean()) if correct.any() else float("nan")
    out["length_incorrect"] = float(lengths[~correct].mean()) if (~correct).any() else float("nan")
    return out
