"""The :class:`Task` interface every prompt source implements, its shared defaults, and
:class:`GeneratedTask`, the one way a task draws seeded examples from a generated question space.

Its own module so that the task kinds (:mod:`jaxrl_llm.data.tasks`, :mod:`jaxrl_llm.data.files`,
the environments of :mod:`jaxrl_llm.data.builtin_envs` and :mod:`jaxrl_llm.data.gem_envs`) import it
without importing each other.
"""
from __future__ import annotations

import abc
from typing import Iterator

import numpy as np

from jaxrl_llm.data.records import HELDOUT, TRAIN, Example, check_split
from jaxrl_llm.rewards import RewardFn

DEFAULT_HELDOUT_FRACTION = 0.3


class Task(abc.ABC):
    """A source of examples with a grader.

    Attributes:
      name: every example's ``task`` field.
      reward_fn: ``reward(completion_text, example) -> float`` for its examples.
      heldout_fraction: share of the questions held out (by question hash).
      correct_threshold: a completion is correct when its reward is at least this
        (1.0: the graders give 1.0 to a right answer, less to anything else). A task
        with graded rewards sets its own; callers ask :meth:`is_correct`.
    """

    name: str
    reward_fn: RewardFn
    heldout_fraction: float
    correct_threshold: float = 1.0

    def is_correct(self, rewards) -> np.ndarray | np.bool_:
        """``rewards >= correct_threshold`` elementwise: a bool array of ``rewards``' shape
        (a scalar, list or array; a numpy bool for a scalar). NaN is never correct.

        The comparison runs in the rewards' own float dtype, so a float32 reward equal
        to the threshold counts as correct whatever the threshold.
        """
        return np.asarray(rewards) >= float(self.correct_threshold)

    @abc.abstractmethod
    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        """``n`` examples of ``split``, a pure function of (task config, split, n, seed).

        Draws are independent and uniform over the split's questions, so
        repeats are possible (the 1-digit addition train split has only 71
        questions); ``unique=True`` skips repeats and raises ValueError if
        the split cannot supply ``n`` distinct questions.
        """

    def _check_request(self, split: str, n: int) -> None:
        check_split(split)
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        empty = (split == HELDOUT and self.heldout_fraction == 0.0) or (
            split == TRAIN and self.heldout_fraction == 1.0
        )
        if empty:
            raise ValueError(
                f"task {self.name!r} has no {split} questions: heldout_fraction={self.heldout_fraction}"
            )


class GeneratedTask(Task):
    """A task over an unbounded (or large) generated question space.

    Examples are drawn from ``_stream(seed)`` and kept when their question
    falls in the requested split (rejection sampling, so draws stay uniform
    over the split).
    """

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False) -> list[Example]:
        self._check_request(split, n)
        picked: list[Example] = []
        seen: set[str] = set()
        stream = self._stream(seed)
        max_draws = 1000 + 200 * n  # a split holding >= 1% of questions fills well within this
        for _ in range(max_draws):
            if len(picked) == n:
                return picked
            example = next(stream)
            if example.split != split or (unique and example.id in seen):
                continue
            seen.add(example.id)
            picked.append(example)
        if len(picked) == n:
            return picked
        raise ValueError(
            f"task {self.name!r}: found only {len(picked)} {'distinct ' if unique else ''}{split} "
            f"questions in {max_draws} draws, {n} requested; the split is too small for this request"
        )

    @abc.abstractmethod
    def _stream(self, seed: int) -> Iterator[Example]:
        """Endless deterministic draws over the whole question space (both splits)."""
