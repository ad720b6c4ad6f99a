"""The example record every prompt source produces, and the train / held-out rule.

Split rule (all tasks): a question is held out iff

    u(key) = int(sha256(key)[:16 hex digits]) / 2**64  <  heldout_fraction

where ``key`` is the question itself (for addition "a + b", for
reasoning-gym the generated question, for a JSONL file the problem text),
never a seed or an index. The same question therefore always lands in the
same split, whatever seed or generator produced it, and the two splits are
disjoint by construction. sha256 rather than ``hash()``: Python salts
``hash`` per process.
"""
from __future__ import annotations

import dataclasses
import hashlib
from typing import Any

TRAIN = "train"
HELDOUT = "heldout"
SPLITS = (TRAIN, HELDOUT)


@dataclasses.dataclass(frozen=True)
class Example:
    """One prompt with its reference answer.

    id:       stable across runs; equal ids mean the same question.
    task:     name of the task (registry name) that made it.
    prompt:   the user message text, before any chat template.
    answer:   reference answer as text, read by the task's reward function.
    split:    "train" or "heldout".
    metadata: task-specific fields (plain JSON-able values), e.g. the operands.
    """

    id: str
    task: str
    prompt: str
    answer: str
    split: str
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def unit_hash(key: str) -> float:
    """A uniform number in [0, 1) fixed by ``key`` (first 64 bits of sha256)."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()
    return int(digest[:16], 16) / 2.0**64


def split_of(key: str, heldout_fraction: float) -> str:
    """"heldout" if unit_hash(key) < heldout_fraction, else "train"."""
    return HELDOUT if unit_hash(key) < heldout_fraction else TRAIN


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; valid splits are {SPLITS}")
    return split


def check_heldout_fraction(heldout_fraction: float) -> float:
    if not 0.0 <= heldout_fraction <= 1.0:
        raise ValueError(f"heldout_fraction must be in [0, 1], got {heldout_fraction!r}")
    return float(heldout_fraction)


def short_hash(key: str) -> str:
    """12 hex digits of sha256, for ids."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:12]
