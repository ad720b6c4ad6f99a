"""Code that uses Python's and NumPy's global random generators, run without touching the caller's.

Environments written for other frameworks draw from ``random`` and ``np.random`` and reseed
them (GEM's ``Env.reset(seed)`` calls ``random.seed(seed); np.random.seed(seed)``). In the
trainer's process that would move the global state every episode, so anything else drawing
from it (a user's reward, a library) would depend on how many episodes ran before: a run
would stop being a function of its seed, and a resumed run would differ from an unbroken one.

A :class:`GlobalRng` is one such user's own pair of global states. ``with rng.installed():``
swaps it in, runs the block, keeps what the block left and puts the caller's states back,
so each user continues its own stream from call to call and the caller's stream never moves.
A module lock serialises the swaps: two threads installing at once would mix their states
(a thread drawing from the globals WITHOUT installing still races with the block).
"""
from __future__ import annotations

import contextlib
import dataclasses
import random
import threading
from typing import Any, Iterator

import numpy as np

_LOCK = threading.RLock()


@dataclasses.dataclass
class GlobalRng:
    """The states of ``random`` (``random.getstate()``) and of ``np.random``'s legacy global
    generator (``np.random.get_state()``) that one user's code sees."""

    python: Any
    numpy: Any

    @classmethod
    def seeded(cls, seed: int) -> "GlobalRng":
        """The states ``random.seed(seed); np.random.seed(seed)`` would set (seed in [0, 2**32))."""
        return cls(random.Random(seed).getstate(), np.random.RandomState(seed).get_state())

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Run the block on these states; afterwards they hold what the block left, and the
        caller's global states are back as they were (also when the block raises)."""
        with _LOCK:
            saved = random.getstate(), np.random.get_state()
            random.setstate(self.python)
            np.random.set_state(self.numpy)
            try:
                yield
            finally:
                self.python, self.numpy = random.getstate(), np.random.get_state()
                random.setstate(saved[0])
                np.random.set_state(saved[1])
