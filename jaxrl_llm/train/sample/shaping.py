"""Reward shaping from the `shaping` config: length-control rewards and DARLING.

    shaped = darling(graders' rewards) + weight * length_reward

DARLING (Li et al. 2025, arXiv 2509.02534) multiplies each answer's reward by the share of
its group outside its equivalence class (`core.diversity_from_classes`); the classes come
from a partition function (texts of one group -> class labels), picked by name from
PARTITIONS:
  "answer":  answers that extract to the same final answer (boxed, <answer> tag or the
             last integer; then math-verify equivalence, `rewards.math_answers_equal`) share
             a class; a text without an extractable answer is a class of its own.
  "lexical": free text; two texts are the same when the Jaccard overlap of their word
             n-gram sets is >= shaping.darling_threshold (n = shaping.darling_ngram),
             closed transitively (`core.ngram_overlap_predicate`).
A new partition is one more entry here (and in the config's choices).

Length rewards (`core.l1_length_reward`, `core.kimi_length_reward`) are added after
DARLING. For L1 each prompt states its target: "Think for N tokens." is appended to
the prompt, N drawn from shaping.l1_targets by a hash of (example id, seed).

The pass rate, dynamic sampling and evaluation keep judging the graders' rewards.
Diversity metrics are logged every step (with the configured partition, or "answer"
when DARLING is off): distinct classes per group and the share of unique answers among
the correct ones.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import Example, Task
from jaxrl_llm.data.records import unit_hash
from jaxrl_llm.rewards import extract_integer_answer, extract_last_boxed, extract_tagged_answer
from jaxrl_llm.rewards import math_answers_equal, normalize_math_answer
from jaxrl_llm.train.config import ShapingConfig

Partition = Callable[[Sequence[str]], list[int]]
TARGET_KEY = "target_tokens"


def extracted_answer(text: str) -> str | None:
    """The final answer a completion gives: \\boxed{}, <answer></answer>, else its integer."""
    for found in (extract_last_boxed(text), extract_tagged_answer(text)):
        if found is not None:
            return normalize_math_answer(found)
    number = extract_integer_answer(text)
    return None if number is None else str(number)


def answer_partition(texts: Sequence[str]) -> list[int]:
    """Classes of equal extracted answers (normalised string, then math-verify)."""
    answers = [extracted_answer(t) for t in texts]

    def same(a: str | None, b: str | None) -> bool:
        if a is None or b is None:
            return False  # no answer: a class of its own
        if a == b or (a.lstrip("-").isdigit() and b.lstrip("-").isdigit()):
            return a == b  # integers: the strings decide, no parser needed
        return math_answers_equal(a, b)

    return core.equivalence_classes(answers, same)


def lexical_partition(ngram: int, threshold: float) -> Partition:
    same = core.ngram_overlap_predicate(ngram, threshold)
    return lambda texts: core.equivalence_classes(list(texts), same)


PARTITIONS: dict[str, Callable[[ShapingConfig], Partition]] = {
    "answer": lambda sh: answer_partition,
    "lexical": lambda sh: lexical_partition(sh.darling_ngram, sh.darling_threshold),
}


def group_classes(sh: ShapingConfig, texts: Sequence[str], prompts: int, group: int) -> list[np.ndarray]:
    """Class labels of each group of `group` texts (prompt-major) under the configured
    partition (shaping.darling; "answer" when DARLING is off)."""
    partition = PARTITIONS[sh.darling if sh.darling != "off" else "answer"](sh)
    return [np.asarray(partition(texts[p * group:(p + 1) * group])) for p in range(prompts)]


def distinct_correct(labels: Sequence[np.ndarray], correct: np.ndarray) -> list[int]:
    """Per group, the number of distinct classes among its correct answers."""
    return [len(set(lab[ok].tolist())) for lab, ok in zip(labels, np.asarray(correct, bool))]


def with_length_targets(sh: ShapingConfig, examples: Sequence[Example], seed: int) -> list[Example]:
    """L1 prompts: each example states its target length ("Think for N tokens."); other
    shaping leaves the examples as they are."""
    targets = sh.l1_targets
    if sh.length_reward != "l1":
        return list(examples)
    out = []
    for e in examples:
        n = targets[int(unit_hash(f"{e.id}:{seed}") * len(targets))]
        out.append(dataclasses.replace(e, prompt=f"{e.prompt}\nThink for {n} tokens.",
                                       metadata={**e.metadata, TARGET_KEY: n}))
    return out


@dataclasses.dataclass(frozen=True)
class Shaped:
    rewards: np.ndarray  # [P, G] what the learner sees
    metrics: dict[str, float]


def shape_rewards(sh: ShapingConfig, task: Task, rewards: np.ndarray, texts: Sequence[str], lengths: np.ndarray,
                  examples: Sequence[Example], base: np.ndarray | None = None) -> Shaped:
    """The learner's rewards [P, G] from the graders' ones (texts prompt-major, G per example).

    `base`: the learner's rewards before shaping when they differ from the graders' (a
    multi-turn episode's discounted return); correctness is always judged on `rewards`."""
    rewards = np.asarray(rewards, np.float32)
    prompts, group = rewards.shape
    correct = np.asarray(task.is_correct(rewards), bool)
    labels = group_classes(sh, texts, prompts, group)
    metrics = diversity_metrics(labels, correct)
    shaped = rewards if base is None else np.asarray(base, np.float32)
    if sh.darling != "off":
        shaped = shaped * np.stack([core.diversity_from_classes(lab) for lab in labels])
    if sh.length_reward == "l1":
        targets = np.array([[e.metadata[TARGET_KEY]] for e in examples], np.float32)
        term = np.asarray(core.l1_length_reward(lengths, targets, alpha=sh.length_reward_weight))
        metrics["l1_length_error"] = float(np.mean(np.abs(np.asarray(lengths) - targets)))
    elif sh.length_reward == "kimi":
        term = sh.length_reward_weight * np.asarray(core.kimi_length_reward(lengths, correct))
    else:
        term = np.zeros_like(shaped)
    if sh.length_reward != "off":
        metrics["length_reward_mean"] = float(term.mean())
    return Shaped((shaped + term).astype(np.float32), metrics)


def diversity_metrics(labels: Sequence[np.ndarray], correct: np.ndarray) -> dict[str, float]:
    """distinct_classes: mean number of classes per group; distinct_correct: mean number of
    distinct classes among a group's correct answers; unique_correct_share: that over the
    number of correct answers, averaged over groups with a correct answer."""
    distinct = [len(set(lab.tolist())) for lab in labels]
    per_correct = list(zip(distinct_correct(labels, correct), np.asarray(correct).sum(axis=1).tolist()))
    with_correct = [d / c for d, c in per_correct if c]
    return {"distinct_classes": float(np.mean(distinct)),
            "distinct_correct": float(np.mean([d for d, _ in per_correct])),
            "unique_correct_share": float(np.mean(with_correct)) if with_correct else float("nan")}
