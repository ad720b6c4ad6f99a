"""The worker-process side of :class:`jaxrl_llm.rewards.pool.GraderPool`: the loop each grader
process runs (load a pickled reward function and its ``warm_up``, then grade one answer per
message), and the parent's handle on one such process, killed and replaced when it overruns.

Messages, parent -> worker: ("load", load_id, pickled_fn), ("grade", index, pickled (completion,
example)), ("stop",). Worker -> parent: ("loaded", load_id), ("load_failed", load_id, message),
(OK, index, value), (ERROR, index, message), (TIMEOUT, index, message) when the grader raised
:class:`GraderTimeout` (it stopped a run of its own at a deadline, e.g. a sandboxed program).
"""
from __future__ import annotations

import dataclasses
import math
import multiprocessing.connection
import os
import pickle
import shutil
import signal
import tempfile
from typing import Any

OK = "ok"
ERROR = "error"
TIMEOUT = "timeout"


class GraderTimeout(Exception):
    """Raised by a grader whose own deadline passed (a sandboxed program ran too long).

    Counted as a timeout, like a grader the pool stops at its deadline, not as an error.
    """


@dataclasses.dataclass(frozen=True)
class Suspected:
    """What a grader returns, instead of a bare float, for an answer that showed a sign of
    forging its reward (e.g. a program whose result is an object with its own ``__eq__``):
    the reward it earned honestly, and the sign. The pool records ``reward`` and counts the
    answer in :attr:`GradeResult.n_forgery_suspected`."""

    reward: float
    reason: str


def describe_error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def new_worker_temp_dir() -> str:
    """A worker's own temporary folder: 0711, so a sandbox's uid can reach a job folder in it."""
    folder = tempfile.mkdtemp(prefix="jaxrl-grader-")
    os.chmod(folder, 0o711)
    return folder


def worker_main(conn: multiprocessing.connection.Connection, temp_dir: str | None = None) -> None:
    """Worker loop: load a reward function, then grade one answer per message."""
    # Ctrl-C in the terminal reaches the whole process group; the parent
    # decides what happens to workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if temp_dir is not None:  # graders' temporary files go where the pool removes them
        os.environ["TMPDIR"] = tempfile.tempdir = temp_dir
    reward_fn = None
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        kind = message[0]
        if kind == "stop":
            return
        if kind == "load":
            _, load_id, pickled_fn = message
            try:
                reward_fn = pickle.loads(pickled_fn)
                warm_up = getattr(reward_fn, "warm_up", None)
                if warm_up is not None:
                    warm_up()
            except Exception as exc:
                conn.send(("load_failed", load_id, describe_error(exc)))
            else:
                conn.send(("loaded", load_id))
            continue
        _, index, payload = message
        try:
            completion, example = pickle.loads(payload)
            value = reward_fn(completion, example)
        except GraderTimeout as exc:
            conn.send((TIMEOUT, index, describe_error(exc)))
            continue
        except Exception as exc:
            conn.send((ERROR, index, describe_error(exc)))
            continue
        try:
            conn.send((OK, index, value))
        except Exception as exc:  # e.g. an unpicklable return value
            conn.send((ERROR, index, f"grader returned an unsendable value: {describe_error(exc)}"))


@dataclasses.dataclass
class Worker:
    process: Any
    conn: multiprocessing.connection.Connection
    loaded: bytes | None = None  # pickled reward function it holds
    load_id: int = 0  # id of the latest load sent; acks of older loads are stale
    job: int | None = None  # completion index it is grading
    deadline: float = math.inf  # for the current job or load
    temp_dir: str | None = None  # its own temporary folder, removed with it


def kill_worker(worker: Worker) -> None:
    """SIGKILL the worker if alive, await it, and remove its temporary folder."""
    if worker.process.is_alive():
        worker.process.kill()
    worker.process.join(timeout=5)
    worker.conn.close()
    if worker.temp_dir is not None:
        shutil.rmtree(worker.temp_dir, ignore_errors=True)


def shutdown_workers(workers: list[Worker]) -> None:
    for worker in workers:
        try:
            worker.conn.send(("stop",))
        except (OSError, ValueError):
            pass
    for worker in workers:
        worker.process.join(timeout=1)
        kill_worker(worker)
    workers.clear()
