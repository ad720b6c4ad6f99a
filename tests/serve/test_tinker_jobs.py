"""The worker's batching rules (serve/tinker/jobs.py), on a real `Jobs` queue with calls that record
what they ran: queued calls of one batch key run as one up to MAX_BATCH_SIZE, calls of one owner keep
their order, a call without an owner ends the search, and each call gets its own result."""
from __future__ import annotations

import asyncio
import threading
import time

from jaxrl_llm.serve.tinker.jobs import MAX_BATCH_SIZE, Batchable, Jobs, Result


def test_queued_calls_batch_by_key_and_keep_each_owners_order():
    jobs, ran, release = Jobs(), [], threading.Event()

    def run_all(items):
        ran.append(tuple(items))
        return [Result(json={"item": item}) if item != "bad" else ValueError("a bad datum") for item in items]

    def call(name, owner, key="fb", size=1):
        return jobs.submit(None, "forward_backward", owner=owner, batch=Batchable(key, name, run_all, size))

    def alone(name, owner):
        return jobs.submit(None, name, lambda: (ran.append(name), Result(json={}))[1], owner=owner)

    try:
        jobs.submit(None, "hold", lambda: (release.wait(30), Result(json={}))[1])
        deadline = time.monotonic() + 30
        while jobs.queued():  # the worker holds the first call
            assert time.monotonic() < deadline
            time.sleep(0.01)
        ids = [call("a1", "A"), alone("optim A", "A"), call("b", "B"), call("a2", "A"), call("c", "C", key="other"),
               call("too big", "F", size=MAX_BATCH_SIZE), call("bad", "D"), alone("create", None),
               call("e", "E", size=MAX_BATCH_SIZE + 1), call("f", "F")]
        release.set()
        results = [asyncio.run(jobs.wait(request_id, 30)) for request_id in ids]
    finally:
        release.set()
        jobs.close()
    # sizes: too big fits no batch but its own (its owner F, f, waits behind it); e alone exceeds the cap
    assert ran == [("a1", "b", "bad"), "optim A", ("a2",), ("c",), ("too big",), "create", ("e",), ("f",)]
    assert results[0].json == {"item": "a1"} and results[2].json == {"item": "b"}
    assert results[6].error == "forward_backward: a bad datum" and results[6].category == "user"
    assert jobs.runs["forward_backward"] == 8
