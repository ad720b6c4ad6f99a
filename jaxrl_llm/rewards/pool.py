"""Grading many completions in parallel, with a deadline per answer.

A verifier that raises, hangs or returns garbage must cost one reward, not the
run. Every answer is graded by ``reward_fn(completion, example)``; an answer
whose grader raises, returns a non-finite or non-numeric value, kills its
worker, or runs past ``timeout_s`` gets reward 0.0 and is counted in the
returned :class:`GradeResult`. A grader with a ``reward_range`` attribute
(``(low, high)``) has its rewards clipped into it; a value outside, or a
:class:`Suspected` returned instead of a float, is counted as a suspected
forgery (``GradeResult.n_forgery_suspected``).

Workers are processes started with ``forkserver`` (or ``spawn``), never a plain
fork: the caller holds JAX's threads, and forking a threaded process can
deadlock the child. The parent talks to each worker over its own pipe and
hands it one answer at a time, so it knows which answer each worker is on and
since when. A worker past its deadline is killed (SIGKILL: a grader stuck in C
code ignores gentler signals) and replaced, and the batch goes on.

The reward function travels to a worker once per batch (by pickle, so it must
be a module-level function) and is imported there, and its ``warm_up`` hook
run (see :func:`jaxrl_llm.rewards.warm_up_with`), before any deadline starts:
import time of math-verify or reasoning-gym never counts as a timeout.

Each worker has a temporary folder of its own (its ``tempfile.gettempdir()`` and ``TMPDIR``),
which the pool removes when it stops or kills the worker: what a killed grader left there
(a sandbox's job folder) does not outlive it.
"""
from __future__ import annotations

import collections
import math
import multiprocessing
import multiprocessing.connection
import numbers
import pickle
import time
import weakref
from typing import Any, Sequence

from jaxrl_llm.rewards.grade_result import Collector, GradeResult, RewardFn, reward_range_of
from jaxrl_llm.rewards.judge import grades_in_batches
from jaxrl_llm.rewards.pool_worker import (OK, TIMEOUT, GraderTimeout, Worker, describe_error,
                                          kill_worker, new_worker_temp_dir, shutdown_workers, worker_main)

_START_METHODS = ("forkserver", "spawn")


def _check_batch(completions: Sequence[str], examples: Sequence[Any]) -> None:
    if len(completions) != len(examples):
        raise ValueError(
            f"got {len(completions)} completions but {len(examples)} examples; "
            "pass one example per completion (repeat an example for each of its samples)"
        )


def grade_in_process(
    reward_fn: RewardFn, completions: Sequence[str], examples: Sequence[Any]
) -> GradeResult:
    """Grade in the calling process: no worker overhead, and no timeout.

    Errors are still caught and counted. Use only for graders that are cheap
    and cannot hang (see :func:`jaxrl_llm.rewards.trusted_in_process`).
    """
    _check_batch(completions, examples)
    collector = Collector(len(completions), reward_range_of(reward_fn))
    for index, (completion, example) in enumerate(zip(completions, examples)):
        try:
            value = reward_fn(completion, example)
        except GraderTimeout as exc:
            collector.grader_timeout(index, describe_error(exc))
        except Exception as exc:  # a grader's bug costs one reward, not the run
            collector.error(index, describe_error(exc))
        else:
            collector.ok(index, value)
    return collector.result()


class GraderPool:
    """A fixed number of grading worker processes, reused across batches.

    Workers start on the first batch that needs them, so a run whose grader
    is trusted in-process never starts any. Not thread-safe: one caller.

    Args:
      num_workers: worker processes (>= 1).
      timeout_s: deadline per answer, in seconds, from when the answer is
        handed to a worker.
      load_timeout_s: deadline for a fresh worker to import the reward
        function; past it the batch fails with RuntimeError, because every
        answer would fail the same way.
      start_method: "forkserver" (default; cheap restarts) or "spawn".
    """

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        *,
        load_timeout_s: float = 120.0,
        start_method: str = "forkserver",
    ):
        if not isinstance(num_workers, int) or num_workers < 1:
            raise ValueError(f"num_workers must be an int >= 1, got {num_workers!r}")
        for name, value in (("timeout_s", timeout_s), ("load_timeout_s", load_timeout_s)):
            if not (isinstance(value, numbers.Real) and 0 < value < math.inf):
                raise ValueError(f"{name} must be a positive finite number of seconds, got {value!r}")
        if start_method not in _START_METHODS:
            raise ValueError(
                f"start_method {start_method!r} is not allowed; use one of {_START_METHODS} "
                "(plain fork is unsafe in a process that runs JAX threads)"
            )
        self.num_workers = num_workers
        self.timeout_s = float(timeout_s)
        self.load_timeout_s = float(load_timeout_s)
        self._context = multiprocessing.get_context(start_method)
        self._workers: list[Worker] = []
        self._finalizer = weakref.finalize(self, shutdown_workers, self._workers)

    def __enter__(self) -> "GraderPool":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker. The pool can still be used; workers restart on demand."""
        shutdown_workers(self._workers)

    @property
    def worker_pids(self) -> tuple[int, ...]:
        return tuple(worker.process.pid for worker in self._workers)

    def grade(
        self,
        reward_fn: RewardFn,
        completions: Sequence[str],
        examples: Sequence[Any],
        *,
        in_process: bool | None = None,
    ) -> GradeResult:
        """Grade ``completions[i]`` against ``examples[i]`` for every i.

        in_process: True grades in this process (no timeout), False in the
          workers; None (default) follows the grader's ``trusted_in_process``
          mark.

        A grader that grades whole batches itself (``grades_in_batches``: the LLM
        judge, rewards/judge.py) is handed the batch: ``reward_fn.grade_batch(self,
        completions, examples)``, in this process; it keeps its own deadlines.
        """
        _check_batch(completions, examples)
        if grades_in_batches(reward_fn):
            return reward_fn.grade_batch(self, completions, examples)
        if in_process is None:
            in_process = getattr(reward_fn, "trusted_in_process", False)
        if in_process or not completions:
            return grade_in_process(reward_fn, completions, examples)
        try:
            pickled_fn = pickle.dumps(reward_fn)
        except Exception as exc:
            raise TypeError(
                f"reward_fn {reward_fn!r} cannot be sent to a worker process ({describe_error(exc)}); "
                "use a module-level function, not a lambda or closure"
            ) from exc
        return self._grade_in_workers(pickled_fn, completions, examples, reward_range_of(reward_fn))

    def _grade_in_workers(
        self, pickled_fn: bytes, completions: Sequence[str], examples: Sequence[Any],
        reward_range: tuple[float, float] | None,
    ) -> GradeResult:
        try:
            return self._run_batch(pickled_fn, completions, examples, reward_range)
        except BaseException:
            # Workers may be mid-answer; a fresh start is the only known state.
            self.close()
            raise

    def _run_batch(
        self, pickled_fn: bytes, completions: Sequence[str], examples: Sequence[Any],
        reward_range: tuple[float, float] | None,
    ) -> GradeResult:
        collector = Collector(len(completions), reward_range)
        pending = collections.deque(range(len(completions)))
        while len(self._workers) < self.num_workers:
            self._workers.append(self._start_worker())
        for worker in self._workers:
            if worker.loaded != pickled_fn:
                self._send_load(worker, pickled_fn)
        n_busy = 0
        while pending or n_busy:
            for worker in self._workers:
                if pending and worker.job is None and worker.loaded == pickled_fn:
                    n_busy += self._send_job(worker, pending, completions, examples, pickled_fn, collector)
            waiting = [w for w in self._workers if w.job is not None or w.loaded != pickled_fn]
            if not waiting:
                continue
            next_deadline = min(w.deadline for w in waiting)
            ready = multiprocessing.connection.wait(
                [w.conn for w in waiting], timeout=max(0.0, next_deadline - time.monotonic())
            )
            for worker in [w for w in waiting if w.conn in ready]:
                n_busy -= self._receive(worker, pickled_fn, collector)
            now = time.monotonic()
            for worker in [w for w in waiting if w.deadline <= now and w.conn not in ready]:
                n_busy -= self._expire(worker, pickled_fn, collector)
        return collector.result()

    def _start_worker(self) -> Worker:
        parent_end, child_end = self._context.Pipe(duplex=True)
        temp_dir = new_worker_temp_dir()
        process = self._context.Process(
            target=worker_main, args=(child_end, temp_dir), daemon=True, name="jaxrl-grader"
        )
        process.start()
        child_end.close()
        return Worker(process=process, conn=parent_end, temp_dir=temp_dir)

    def _send_load(self, worker: Worker, pickled_fn: bytes) -> None:
        worker.load_id += 1
        worker.conn.send(("load", worker.load_id, pickled_fn))
        worker.loaded = None
        worker.deadline = time.monotonic() + self.load_timeout_s

    def _send_job(self, worker, pending, completions, examples, pickled_fn, collector) -> int:
        """Hand the next pending answer to an idle worker; returns 1 if it was sent."""
        index = pending.popleft()
        try:
            payload = pickle.dumps((completions[index], examples[index]))
        except Exception as exc:
            collector.error(index, f"example cannot be sent to a worker: {describe_error(exc)}")
            return 0
        try:
            worker.conn.send(("grade", index, payload))
        except OSError:  # the worker died while idle; retry the answer on a fresh one
            pending.appendleft(index)
            self._swap_for_fresh(worker, pickled_fn)
            return 0
        worker.job = index
        worker.deadline = time.monotonic() + self.timeout_s
        return 1

    def _receive(self, worker: Worker, pickled_fn: bytes, collector: Collector) -> int:
        """Handle one message from a worker; returns how many jobs finished (0 or 1)."""
        try:
            message = worker.conn.recv()
        except (EOFError, OSError):
            return self._replace_dead(worker, pickled_fn, collector)
        kind = message[0]
        if kind in ("loaded", "load_failed") and message[1] != worker.load_id:
            return 0  # ack of a load sent for an earlier batch, superseded since
        if kind == "loaded":
            worker.loaded = pickled_fn
            worker.deadline = math.inf
            return 0
        if kind == "load_failed":
            raise RuntimeError(f"grading worker could not load the reward function: {message[2]}")
        _, index, payload = message
        if kind == OK:
            collector.ok(index, payload)
        elif kind == TIMEOUT:
            collector.grader_timeout(index, payload)
        else:
            collector.error(index, payload)
        worker.job = None
        worker.deadline = math.inf
        return 1

    def _replace_dead(self, worker: Worker, pickled_fn: bytes, collector: Collector) -> int:
        worker.process.join(timeout=5)
        code = worker.process.exitcode
        if worker.job is None:
            raise RuntimeError(
                f"grading worker exited with code {code} while loading the reward function"
            )
        collector.error(worker.job, f"grading worker died (exit code {code})")
        self._swap_for_fresh(worker, pickled_fn)
        return 1

    def _expire(self, worker: Worker, pickled_fn: bytes, collector: Collector) -> int:
        if worker.job is None:
            kill_worker(worker)
            raise RuntimeError(
                f"grading worker did not load the reward function within {self.load_timeout_s:g} s"
            )
        collector.timeout(worker.job, self.timeout_s)
        self._swap_for_fresh(worker, pickled_fn)
        return 1

    def _swap_for_fresh(self, worker: Worker, pickled_fn: bytes) -> None:
        kill_worker(worker)
        fresh = self._start_worker()
        self._workers[self._workers.index(worker)] = fresh
        self._send_load(fresh, pickled_fn)


def grade_batch(
    reward_fn: RewardFn,
    completions: Sequence[str],
    examples: Sequence[Any],
    *,
    num_workers: int,
    timeout_s: float,
    in_process: bool | None = None,
) -> GradeResult:
    """One-shot grading: a temporary :class:`GraderPool`, closed afterwards.

    ``num_workers=0`` grades in this process (as ``in_process=True``). A
    training loop should keep one GraderPool instead: starting workers costs
    about a second per batch.
    """
    if num_workers == 0:
        if in_process is False:
            raise ValueError("num_workers=0 grades in process; in_process=False needs num_workers >= 1")
        return grade_in_process(reward_fn, completions, examples)
    with GraderPool(num_workers, timeout_s) as pool:
        return pool.grade(reward_fn, completions, examples, in_process=in_process)
