"""Graders that fail on purpose, to test the pool. Module-level so workers can import them.

Each behaves like a real grader (1.0 for completion "right", 0.0 otherwise)
except on a trigger completion.
"""
import os
import time

from jaxrl_llm.rewards import warm_up_with


def raises_on_boom(completion: str, example) -> float:
    if completion == "boom":
        raise ValueError("grader exploded on purpose")
    return float(completion == "right")


def hangs_on_hang(completion: str, example) -> float:
    if completion == "hang":
        time.sleep(3600)
    return float(completion == "right")


def exits_on_die(completion: str, example) -> float:
    if completion == "die":
        os._exit(3)  # as a segfaulting C extension would: no exception, the process is gone
    return float(completion == "right")


def returns_garbage(completion: str, example):
    return {"right": 1.0, "nan": float("nan"), "text": "1.0"}.get(completion, 0.0)


def worker_pid(completion: str, example) -> float:
    return float(os.getpid())



def _broken_setup():
    raise ImportError("verifier library missing on purpose")


@warm_up_with(_broken_setup)
def cannot_load(completion: str, example) -> float:
    return 1.0
