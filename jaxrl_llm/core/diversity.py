"""DARLING diversity-aware rewards (docs/objectives.md#darling-diversity-rewards).

Li et al. 2025, "Jointly Reinforcing Diversity and Quality in Language Model
Generations" (DARLING, arXiv 2509.02534): partition a group's responses into
equivalence classes under a pairwise "same" predicate closed transitively,
score each response's diversity as the fraction of the OTHER responses that
fall outside its class, and multiply it into the reward.

The predicate is arbitrary Python (answer normalisation, n-gram overlap, a
classifier), so this runs host-side on lists; its output feeds any advantage
estimator as ordinary [P, G] rewards.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np


def equivalence_classes(items: Sequence[Any], same_fn: Callable[[Any, Any], bool]) -> list[int]:
    """Labels the transitive closure of `same_fn` over `items` (union-find).

    Two items share a class when a chain of pairwise `same_fn` matches joins
    them. Pairs already joined are not asked again, which does not change the
    closure.

    Returns:
      class id per item, numbered 0, 1, ... in order of first appearance.
    """
    parent = list(range(len(items)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]  # path halving keeps the trees flat
            i = parent[i]
        return i

    for i in range(len(items)):
        for j in range(i + 1, len(items)):
            root_i, root_j = root(i), root(j)
            if root_i != root_j and same_fn(items[i], items[j]):
                parent[max(root_i, root_j)] = min(root_i, root_j)

    labels: dict[int, int] = {}
    return [labels.setdefault(root(i), len(labels)) for i in range(len(items))]


def diversity_scores(responses: Sequence[Any], same_fn: Callable[[Any, Any], bool]) -> np.ndarray:
    """div_i = (number of responses outside i's class) / (G - 1).

    Returns:
      [G] float32 in [0, 1]. For G = 1 there is nothing to be redundant with,
      so the single response gets 1 (its reward is left unchanged).
    """
    if len(responses) == 1:
        return np.ones(1, np.float32)
    return diversity_from_classes(equivalence_classes(responses, same_fn))


def diversity_from_classes(labels: Sequence[int]) -> np.ndarray:
    """div_i = (G - |class of i|) / (G - 1) from one group's class labels (any partition:
    `equivalence_classes` of a predicate, extracted answers, a classifier's clusters).

    Returns:
      [G] float32 in [0, 1]; 1 for a group of one.
    """
    labels = np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1)
    group_size = labels.shape[0]
    if group_size == 1:
        return np.ones(1, np.float32)
    class_sizes = np.bincount(labels)[labels]
    return ((group_size - class_sizes) / (group_size - 1)).astype(np.float32)


def darling_rewards(rewards_row, responses: Sequence[Any], same_fn: Callable[[Any, Any], bool]) -> np.ndarray:
    """DARLING multiplicative reward for one group: r'_i = r_i * div_i.

    The multiplicative form worked best in Li et al. 2025. Use the result in
    place of the raw rewards, then any advantage estimator.

    Args:
      rewards_row: [G] rewards of one prompt's samples.
      responses: G items handed to `same_fn` (texts, parsed answers, ...).
      same_fn: symmetric predicate, True when two responses are "the same".
    Returns:
      [G] float32.
    """
    rewards_row = np.asarray(rewards_row, np.float32)
    if rewards_row.ndim != 1 or rewards_row.shape[0] != len(responses):
        raise ValueError(
            f"rewards_row shape {rewards_row.shape} does not match {len(responses)} responses; "
            "need one reward per response"
        )
    return rewards_row * diversity_scores(responses, same_fn)


def darling_rewards_batch(rewards, responses: Sequence[Sequence[Any]], same_fn) -> np.ndarray:
    """`darling_rewards` for every group of a [P, G] batch (responses[p][g])."""
    rewards = np.asarray(rewards, np.float32)
    if rewards.ndim != 2 or len(responses) != rewards.shape[0]:
        raise ValueError(
            f"rewards shape {rewards.shape} does not match {len(responses)} groups of responses"
        )
    return np.stack([darling_rewards(r, group, same_fn) for r, group in zip(rewards, responses)])


def _normalise_text(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s]", " ", text.lower()).split())


def same_normalised_text(a: str, b: str) -> bool:
    """Predicate: equal after lower-casing, dropping punctuation and collapsing spaces."""
    return _normalise_text(a) == _normalise_text(b)


def ngram_overlap_predicate(n: int = 3, threshold: float = 0.5) -> Callable[[str, str], bool]:
    """Predicate factory: Jaccard overlap of word n-gram sets >= threshold.

    A cheap lexical stand-in for the paper's learned classifier (not released).
    Texts shorter than n words compare as a single n-gram of all their words.
    """
    if n < 1 or not 0.0 < threshold <= 1.0:
        raise ValueError(f"need n >= 1 and 0 < threshold <= 1, got n={n}, threshold={threshold}")

    def grams(text: str) -> set[tuple[str, ...]]:
        words = _normalise_text(text).split()
        if len(words) < n:
            return {tuple(words)}
        return {tuple(words[k : k + n]) for k in range(len(words) - n + 1)}

    def same(a: str, b: str) -> bool:
        grams_a, grams_b = grams(a), grams(b)
        return len(grams_a & grams_b) / len(grams_a | grams_b) >= threshold

    return same
