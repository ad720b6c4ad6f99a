"""Training-state checkpoints (orbax) and a graceful-stop signal flag.

A checkpoint holds one pytree (params, optimiser state, loss scale, step,
PRNG key, data position, ... whatever the loop puts in it) plus a small JSON
metadata dict. Restoring with a `target` pytree of the same structure gives
back bitwise-identical arrays with the target's pytree types (optax
namedtuples), dtypes and shardings, including typed PRNG keys.

Atomicity comes from orbax: a step is written into `<step>.orbax-checkpoint-tmp`
and renamed to `<step>` only when complete, so a crash mid-save leaves at
worst a temporary directory, which `latest_step` ignores; a Checkpointer
opening the directory removes it in the background (done before its first
save). A finished step that cannot be read back (files damaged or removed
afterwards) is skipped by `restore_latest`, which falls back to the newest
readable one, says so in the log, and moves the bad one aside to
`<step>.unreadable` so that the step can be written again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import jax
import numpy as np
import orbax.checkpoint as ocp

from jaxrl_llm.bridge import CheckpointError

log = logging.getLogger(__name__)

_STATE = "state"
_METADATA = "metadata"


@dataclasses.dataclass(frozen=True)
class Restored:
    step: int
    state: Any
    metadata: dict[str, Any]


def _to_savable(tree: Any) -> Any:
    # orbax rejects numpy scalars (np.int64(3)); a 0-d array holds the same bits.
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, np.generic) else x, tree)


def _like_target(restored: Any, target: Any) -> Any:
    """Gives numpy-scalar leaves of the target back their scalar type."""
    return jax.tree.map(
        lambda r, t: t.dtype.type(np.asarray(r)) if isinstance(t, np.generic) else r, restored, target
    )


class Checkpointer:
    """Periodic and on-demand checkpoints of a training-state pytree.

    Args:
      directory: where step directories are written (created if missing).
      every_steps: `should_save(step)` is true every this many steps; 0 turns
        periodic saving off (saves with `force=True` still happen).
      keep: number of most recent checkpoints kept on disk.
      async_save: write in a background thread; `save` returns once arrays
        are copied off the device. `wait()` / `close()` block until written.
    """

    def __init__(self, directory: str | os.PathLike, *, every_steps: int, keep: int, async_save: bool = True):
        if every_steps < 0:
            raise ValueError(f"every_steps = {every_steps} is invalid; valid: >= 0 (0: only forced saves)")
        if keep < 1:
            raise ValueError(f"keep = {keep} is invalid; valid: >= 1")
        self.directory = Path(directory).absolute()
        self.every_steps = every_steps
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep,
            create=True,
            # Leftovers of a save that was killed mid-way; never a finished step.
            cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save,
        )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=(_STATE, _METADATA))

    def should_save(self, step: int) -> bool:
        return self.every_steps > 0 and step > 0 and step % self.every_steps == 0

    def save(self, step: int, state: Any, *, metadata: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Saves `state` at `step` if it is a periodic step or `force`; returns whether it saved.

        A step that is already on disk is not written again (returns False).
        """
        if not (force or self.should_save(step)):
            return False
        if step in self.all_steps():
            return False
        args = ocp.args.Composite(
            **{
                _STATE: ocp.args.StandardSave(_to_savable(state)),
                _METADATA: ocp.args.JsonSave(dict(metadata or {})),
            }
        )
        return bool(self._manager.save(step, args=args, force=True))

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore(self, target: Any = None, *, step: int | None = None) -> Restored:
        """Restores `step` (default: the latest complete checkpoint).

        Args:
          target: a pytree like the saved state (concrete arrays or
            jax.ShapeDtypeStruct); gives the result its structure, dtypes and
            shardings. Without it, the raw nested dicts/lists orbax stored
            come back (namedtuples become lists).
        """
        self.wait()
        if step is None:
            step = self.latest_step()
            if step is None:
                raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
        elif step not in self.all_steps():
            raise FileNotFoundError(f"no checkpoint for step {step} in {self.directory}; available: {self.all_steps()}")
        state_arg = ocp.args.StandardRestore(None if target is None else _to_savable(target))
        restored = self._manager.restore(
            step, args=ocp.args.Composite(**{_STATE: state_arg, _METADATA: ocp.args.JsonRestore()})
        )
        state = restored[_STATE] if target is None else _like_target(restored[_STATE], target)
        return Restored(step=step, state=state, metadata=dict(restored[_METADATA] or {}))

    def restore_latest(self, target: Any = None) -> Restored | None:
        """`restore(target)` of the newest checkpoint that can be read, or None when there is
        none (fresh run). Unreadable newer ones are logged and moved aside (see the module doc);
        if none can be read, CheckpointError lists why."""
        unreadable: dict[int, str] = {}
        for step in reversed(self.all_steps()):
            try:
                restored = self.restore(target, step=step)
            except Exception as err:  # orbax raises many kinds for damaged files
                unreadable[step] = f"{type(err).__name__}: {str(err)[:300]}"
                log.warning("checkpoint %s cannot be restored (%s); trying the previous one",
                            self.directory / str(step), unreadable[step])
                continue
            if unreadable:
                self._move_aside(list(unreadable))
                log.warning("resuming from step %d, the newest readable checkpoint in %s; unreadable step(s) %s "
                            "moved aside to <step>.unreadable", step, self.directory, sorted(unreadable))
            return restored
        if unreadable:
            raise CheckpointError(f"no checkpoint in {self.directory} can be restored: "
                               + "; ".join(f"step {k}: {v}" for k, v in unreadable.items()))
        return None

    def _move_aside(self, steps: Sequence[int]) -> None:
        for step in steps:
            path = self.directory / str(step)
            path.rename(self.directory / f"{step}.unreadable")
        self._manager.reload()

    def wait(self) -> None:
        """Blocks until a background save has been written and finalised."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class StopFlag:
    """Set by a signal handler; the training loop polls it, saves and exits.

    The handler only sets a flag: a signal may arrive in the middle of a jit
    call or an orbax write, and the loop is the one place that knows when
    the state is consistent. A second delivery of the same signal falls back
    to the handler that was installed before (default: terminate; for
    SIGINT, KeyboardInterrupt), so a stuck run can still be stopped.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, reason: str = "requested") -> None:
        """Sets the flag by hand (e.g. from a time-limit check)."""
        self.signal_name = self.signal_name or reason
        self._event.set()

    def requested_on_any_process(self) -> bool:
        """True if any JAX process saw a stop request.

        In a multi-host run every process must take the save-and-exit branch
        at the same step, or the collective save would hang; call this at the
        same point of every process's loop.
        """
        if jax.process_count() == 1:
            return self.requested
        from jax.experimental import multihost_utils

        flags = multihost_utils.process_allgather(np.asarray(self.requested, dtype=np.int32))
        return bool(np.asarray(flags).any())

    def _handle(self, signum: int, frame: Any) -> None:
        if self._event.is_set():
            self._fall_back(signum)
            return
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def _fall_back(self, signum: int) -> None:
        previous = self._previous.get(signum)
        if previous is None:  # installed outside Python: treat as the default action
            previous = signal.SIG_DFL
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, None)
        else:
            signal.raise_signal(signum)

    def uninstall(self) -> None:
        """Puts back the handlers that were installed before."""
        for signum, previous in self._previous.items():
            signal.signal(signum, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def __enter__(self) -> "StopFlag":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.uninstall()


def install_stop_handler(signals: Sequence[int] = (signal.SIGTERM,)) -> StopFlag:
    """Installs handlers for `signals` (default SIGTERM) that set the returned flag.

    Must be called from the main thread (a Python rule for signal handlers).
    Typical loop:

        stop = install_stop_handler()
        for step in ...:
            ...
            if stop.requested:  # requested_on_any_process() when multi-host
                ckpt.save(step, state, force=True); ckpt.close(); break
    """
    flag = StopFlag()
    for signum in signals:
        flag._previous[signum] = signal.signal(signum, flag._handle)
    return flag
