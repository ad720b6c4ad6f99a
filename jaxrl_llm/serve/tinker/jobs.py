"""Tinker's futures: every training or sampling call is answered at once with a request id, runs
later on one worker thread (JAX work, in arrival order), and its result is fetched with
retrieve_future, which waits up to POLL_WAIT_S for it and otherwise answers "try_again".

A call carries a key (its model or sampling session and its seq_id): a retried call with a key
already seen gets the first call's request id back and never runs again.

Batching: the worker takes every queued call at once. A batchable call (`Batchable`, forward and
forward_backward) runs together with the later queued calls of the same batch key, up to
MAX_BATCH calls and MAX_BATCH_SIZE of their sizes (padded tokens: the memory of one forward
grows with them; a call alone may be larger), in one `run_all`. Order is kept per owner (the model or sampling session a call
works on): a call joins only if no call of its owner is already in the batch or was passed over,
and a call without an owner (create_model, a load into a new model) ends the search.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import queue
import threading
import uuid
from typing import Any, Callable, Hashable

log = logging.getLogger(__name__)

POLL_WAIT_S = 20.0  # below the SDK's 45 s read timeout on retrieve_future
KEEP_RESULTS = 50_000  # completed results kept for late or repeated polls
MAX_BATCH = 8  # calls run as one at most
MAX_BATCH_SIZE = 4096  # summed Batchable.size of a batch of several calls


@dataclasses.dataclass(frozen=True)
class Result:
    """A finished call: JSON (a dict), protobuf bytes, or a failure in the SDK's shape."""

    json: dict | None = None
    proto: bytes | None = None
    error: str | None = None
    category: str = "user"  # RequestErrorCategory: "user" | "server" | "unknown"

    def failure_body(self) -> dict:
        return {"error": self.error, "category": self.category}


class UserError(ValueError):
    """A call the server refuses (bad input); its message is returned to the client."""


@dataclasses.dataclass(frozen=True)
class Batchable:
    """A call that runs with the queued calls of the same key: run_all(their items, in queue order)
    returns a Result or the exception that failed it, per item."""

    key: Hashable
    item: Any
    run_all: Callable[[list[Any]], list["Result | Exception"]]
    size: int = 1  # what the call adds to a batch (the learner's padded tokens)


@dataclasses.dataclass
class _Job:
    request_id: str
    name: str
    run: Callable[[], Result] | None
    owner: Hashable | None = None
    batch: Batchable | None = None
    done: threading.Event = dataclasses.field(default_factory=threading.Event)
    result: Result | None = None
    waiters: list = dataclasses.field(default_factory=list)  # (event loop, asyncio.Event) of pending polls


class Jobs:
    """The queue of calls, the worker thread that runs them and their results by request id."""

    def __init__(self):
        self._lock = threading.Lock()
        self._by_key: dict[Hashable, str] = {}
        self._jobs: collections.OrderedDict[str, _Job] = collections.OrderedDict()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self.runs = collections.Counter()  # calls run, by name (what the retry test counts)
        self._worker = threading.Thread(target=self._work, name="tinker-jobs", daemon=True)
        self._worker.start()

    def submit(self, key: Hashable | None, name: str, run: Callable[[], Result] | None = None, *,
               owner: Hashable | None = None, batch: Batchable | None = None) -> str:
        """The request id of the call `key` (a new one, queued, unless the key was seen before): it
        runs `run()`, or with `batch` its batch's run_all; `owner` orders it (module docstring)."""
        with self._lock:
            if key is not None and key in self._by_key:
                log.info("%s %s: a retry of request %s; not run again", name, key, self._by_key[key])
                return self._by_key[key]
            job = _Job(f"{name}-{uuid.uuid4().hex[:16]}", name, run, owner, batch)
            self._jobs[job.request_id] = job
            if key is not None:
                self._by_key[key] = job.request_id
            self._forget_old()
        self._queue.put(job)
        return job.request_id

    def _forget_old(self) -> None:
        while len(self._jobs) > KEEP_RESULTS:
            oldest = next(iter(self._jobs.values()))
            if not oldest.done.is_set():
                break
            del self._jobs[oldest.request_id]

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._jobs

    async def wait(self, request_id: str, timeout_s: float = POLL_WAIT_S) -> Result | None:
        """The call's result, or None if it is still running after timeout_s."""
        event = asyncio.Event()
        with self._lock:
            job = self._jobs[request_id]
            if job.done.is_set():
                return job.result
            job.waiters.append((asyncio.get_running_loop(), event))
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                job.waiters = [w for w in job.waiters if w[1] is not event]
        return job.result if job.done.is_set() else None

    def queued(self) -> int:
        """Calls waiting for the worker (not counting those it has taken)."""
        return self._queue.qsize()

    def _work(self) -> None:
        pending: collections.deque[_Job | None] = collections.deque()
        while True:
            if not pending:
                pending.append(self._queue.get())
            while not self._queue.empty():
                pending.append(self._queue.get_nowait())
            if pending[0] is None:  # close(): every call queued before it has run
                return
            self._finish(take_batch(pending))

    def _finish(self, batch: list[_Job]) -> None:
        for job, result in zip(batch, _run_batch(batch)):
            job.result = result
            self.runs[job.name] += 1
            with self._lock:
                job.done.set()
                waiters, job.waiters = job.waiters, []
            for loop, event in waiters:  # wake the polls waiting on it, on their own event loop
                loop.call_soon_threadsafe(event.set)

    def close(self) -> None:
        self._queue.put(None)
        self._worker.join(timeout=30)


def take_batch(pending: collections.deque) -> list[_Job]:
    """The calls to run now, removed from `pending`: its first call and, if batchable, the later
    calls that may join it (module docstring)."""
    head = pending.popleft()
    if head.batch is None:
        return [head]
    batch, seen, size = [head], {head.owner}, head.batch.size
    for job in pending:
        if job is None or job.owner is None or len(batch) == MAX_BATCH:
            break
        if job.batch is not None and job.batch.key == head.batch.key and job.owner not in seen \
                and size + job.batch.size <= MAX_BATCH_SIZE:
            batch.append(job)
            size += job.batch.size
        seen.add(job.owner)
    for job in batch[1:]:
        pending.remove(job)
    return batch


def _run_batch(batch: list[_Job]) -> list[Result]:
    if batch[0].batch is None:
        return [_run(batch[0])]
    try:
        outcomes = batch[0].batch.run_all([job.batch.item for job in batch])
    except Exception as err:  # noqa: BLE001  (reported to every call of the batch)
        outcomes = [err] * len(batch)
    return [o if isinstance(o, Result) else _failure(job, o) for job, o in zip(batch, outcomes)]


def _run(job: _Job) -> Result:
    try:
        return job.run()
    except Exception as err:  # noqa: BLE001
        return _failure(job, err)


def _failure(job: _Job, err: Exception) -> Result:
    if isinstance(err, (UserError, ValueError, KeyError, TypeError)):
        message = str(err) if not isinstance(err, KeyError) else str(err.args[0] if err.args else err)
        return Result(error=f"{job.name}: {message}", category="user")
    # a server fault: logged, reported, the server keeps running
    log.error("%s failed", job.request_id, exc_info=err)
    return Result(error=f"{job.name}: server error {type(err).__name__}: {err}", category="server")


def json_result(payload: Any) -> Result:
    return Result(json=payload)
