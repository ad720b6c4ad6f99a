"""DAPO dynamic sampling: fill the step batch with groups whose accuracy is neither 0 nor 1.

Yu et al. 2025, DAPO (arXiv 2503.14476), section 3.2: a group whose G answers are all
right or all wrong has zero advantage under any group baseline and gives no gradient,
so DAPO over-samples and keeps only groups with 0 < accuracy < 1 until the batch holds
P of them. The decision is on ACCURACY (`task.is_correct` of the graders' rewards), not
on the shaped reward: an all-correct group whose lengths differ is still dropped,
although the overlong penalty or a length reward would make its shaped rewards differ.

Round r of step s samples P fresh prompts (round 0: the step's own prompts, so a run
without dynamic sampling sees the same data) with a seed that is a pure function of
(seed, s, r): a resumed run redraws exactly the same rounds. At most
`rollout.dynamic_sampling_rounds` rounds are drawn; if they hold fewer than P
informative groups the remaining slots take the earliest zero-accuracy-variance groups
(the learner's zero-variance filter, if the recipe has one, then removes them), and the
step's metrics count them (`dynamic_sampling_unfilled`).
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord


@dataclasses.dataclass(frozen=True)
class SampledRound:
    """One round: its rollouts (P prompts x G samples), their graded rewards [P, G] and
    what the caller wants to keep alongside (e.g. grader error counts)."""

    rollouts: RolloutBatch
    rewards: np.ndarray
    extra: object = None


@dataclasses.dataclass(frozen=True)
class FilledBatch:
    """The step batch chosen from the rounds: group p came from `rounds[source[p][0]]`,
    prompt source[p][1]."""

    rollouts: RolloutBatch
    rewards: np.ndarray  # [P, G]
    source: tuple[tuple[int, int], ...]
    metrics: dict[str, float]


def informative_groups(correct: np.ndarray) -> np.ndarray:
    """[P] bool: groups whose accuracy over their G samples is strictly between 0 and 1.

    keep_p = 0 < (1/G) sum_g correct_pg < 1
    """
    correct = np.asarray(correct, bool)
    if correct.ndim != 2:
        raise ValueError(f"correct must be [P, G], got shape {correct.shape}")
    accuracy = correct.mean(axis=1)
    return (accuracy > 0) & (accuracy < 1)


def round_seed(step_seed: int, round_index: int) -> int:
    """The seed of round r of a step: the step's own seed for r = 0, else a hash of (step seed, r)."""
    if round_index == 0:
        return int(step_seed)
    return int(np.random.SeedSequence([int(step_seed), int(round_index)]).generate_state(1, np.uint32)[0])


def sample_until_full(sample_round: Callable[[int], SampledRound], is_correct: Callable[[np.ndarray], np.ndarray],
                      *, max_rounds: int) -> tuple[FilledBatch, list[SampledRound]]:
    """Draws rounds 0, 1, ... (at most max_rounds) until they hold as many informative
    groups as one round has prompts, and assembles the step batch (see the module doc).

    Returns the filled batch and every round drawn.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds = {max_rounds} is invalid; valid: >= 1")
    rounds: list[SampledRound] = []
    kept: list[tuple[int, int]] = []
    while len(rounds) < max_rounds:
        rnd = sample_round(len(rounds))
        keep = informative_groups(is_correct(rnd.rewards))
        kept += [(len(rounds), int(p)) for p in np.flatnonzero(keep)]
        rounds.append(rnd)
        if len(kept) >= rnd.rewards.shape[0]:
            break
    prompts = rounds[0].rewards.shape[0]
    chosen = kept[:prompts]
    unfilled = prompts - len(chosen)
    if unfilled:  # bound reached: the earliest uninformative groups fill the rest
        taken = set(chosen)
        chosen += [(r, p) for r, rnd in enumerate(rounds) for p in range(prompts) if (r, p) not in taken][:unfilled]
    return assemble(rounds, chosen, kept_groups=len(kept), unfilled=unfilled), rounds


def assemble(rounds: Sequence[SampledRound], chosen: Sequence[tuple[int, int]], *, kept_groups: int,
             unfilled: int) -> FilledBatch:
    """The batch of the chosen (round, prompt) groups, renumbered 0..P-1, and its metrics."""
    group = rounds[0].rollouts.samples_per_prompt
    records: list[RolloutRecord] = []
    for new_index, (r, p) in enumerate(chosen):
        for rec in rounds[r].rollouts.records[p * group:(p + 1) * group]:
            records.append(dataclasses.replace(rec, prompt_index=new_index))
    rewards = np.stack([rounds[r].rewards[p] for r, p in chosen]).astype(np.float32)
    extra_tokens = sum(rec.num_completion_tokens for rnd in rounds[1:] for rec in rnd.rollouts.records)
    sampled_groups = sum(rnd.rewards.shape[0] for rnd in rounds)
    metrics = {"dynamic_sampling_rounds": float(len(rounds)),
               "dynamic_sampling_extra_tokens": float(extra_tokens),
               "dynamic_sampling_kept_fraction": kept_groups / sampled_groups,
               "dynamic_sampling_unfilled": float(unfilled)}
    return FilledBatch(RolloutBatch(tuple(records), num_prompts=len(chosen), samples_per_prompt=group), rewards,
                       tuple(chosen), metrics)
