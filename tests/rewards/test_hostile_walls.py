"""The sandbox's walls against hostile programs, through the real grading path.

Every program of tests/rewards/wall_cases.py goes through one batch of a 2-worker GraderPool
with ``code_reward`` and the default SandboxLimits, in workers whose environment holds a
planted secret. Each must score 0 (it wins 1.0 only if its wall fell) and end in the status
its containment implies; then, checked from outside: the secret appears in nothing the batch
returned, no sandbox process is left, the workers were not replaced, no job folder is left,
host files are untouched, the host's listening port saw no connection, and an honest program
that uses /tmp, /dev/shm, SysV shared memory and threads still scores 1.

Which case falls when a wall is taken down is recorded in docs/architecture.md ("Code
execution sandbox").
"""
from __future__ import annotations

import dataclasses
import os
import socket
import threading
import time

import pytest

from jaxrl_llm.rewards import GraderPool, GradeResult, code_reward
from jaxrl_llm.rewards.sandbox_walls import IPC_SYSCTLS, MB, PAGE, SandboxLimits, memory_bound_mb, socket_buffer_filter
from tests.rewards import wall_cases
from tests.rewards.sandbox_cases import (PWNED_TEST, CodeExample, fenced, require_sandbox, sandbox_processes_under,
                                         worker_temp_dirs)

STATIC_CASES = wall_cases.ENVIRONMENT_CASES + wall_cases.MEMORY_CASES + wall_cases.HOLDING_CASES
RUNTIME_CASE_NAMES = ("delete and write host files", "connect to a port the grader's host listens on")


def default_limits_example() -> CodeExample:
    return CodeExample(answer="", metadata={"tests": [PWNED_TEST], "scoring": "fraction"})  # no "sandbox": defaults


@dataclasses.dataclass
class Battery:
    cases: list[wall_cases.Case]
    result: GradeResult
    honest_reward: float
    wall_s: float
    processes_left: list[int]
    workers_replaced: bool
    job_dirs_left: list[str]
    host_files_ok: bool
    connections_seen: int

    def outcome(self, name: str) -> tuple[float, str, str]:
        index = [case.name for case in self.cases].index(name)
        errors = [e for e in self.result.errors if e.startswith(f"completion {index}:")]
        return self.result.rewards[index], self.result.statuses[index], " ".join(errors)


@pytest.fixture(scope="module")
def battery(tmp_path_factory) -> Battery:
    require_sandbox()
    host = tmp_path_factory.mktemp("host")
    planted, escaped = host / "metrics.jsonl", host / "escaped.txt"
    planted.write_text("keep me")
    previous = os.environ.get(wall_cases.SECRET_NAME)
    os.environ[wall_cases.SECRET_NAME] = wall_cases.SECRET  # as a researcher's shell would hold it
    try:
        with socket.socket() as listener, GraderPool(2, timeout_s=10.0) as pool:
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            cases = STATIC_CASES + [wall_cases.write_host_file_case(str(planted), str(escaped)),
                                    wall_cases.connect_case(listener.getsockname()[1])]
            grader = wall_cases.code_reward_holding_a_secret
            pool.grade(grader, [fenced("def f():\n    return 'pwned'")] * 2, [default_limits_example()] * 2)
            pids, temp_dirs = pool.worker_pids, worker_temp_dirs(pool)
            completions = [fenced(case.program) for case in cases] + [fenced(wall_cases.HONEST_NEIGHBOUR)]
            started = time.monotonic()
            result = pool.grade(grader, completions, [default_limits_example()] * len(completions))
            wall_s = time.monotonic() - started
            listener.setblocking(False)
            connections = 0
            try:
                while listener.accept():
                    connections += 1
            except BlockingIOError:
                pass
            return Battery(
                cases=cases, result=result, honest_reward=result.rewards[-1], wall_s=wall_s,
                processes_left=sandbox_processes_under(temp_dirs), workers_replaced=pool.worker_pids != pids,
                job_dirs_left=[f"{d}/{name}" for d in temp_dirs for name in os.listdir(d)],
                host_files_ok=planted.read_text() == "keep me" and not escaped.exists(),
                connections_seen=connections)
    finally:
        if previous is None:
            os.environ.pop(wall_cases.SECRET_NAME, None)
        else:
            os.environ[wall_cases.SECRET_NAME] = previous


@pytest.mark.parametrize("name", [case.name for case in STATIC_CASES] + list(RUNTIME_CASE_NAMES))
def test_hostile_program_scores_zero(battery, name):
    reward, status, errors = battery.outcome(name)
    case = battery.cases[[c.name for c in battery.cases].index(name)]
    assert reward == 0.0, f"{name!r} beat the wall {case.wall!r}: {status} {errors}"
    assert status in case.statuses, f"{name!r}: status {status}, expected one of {case.statuses}: {errors}"
    assert wall_cases.SECRET not in errors


def test_nothing_escapes_the_batch(battery):
    assert len(battery.cases) + 1 >= 30  # the battery's size, the honest neighbour included
    assert battery.honest_reward == 1.0, battery.result.errors[-3:]
    assert wall_cases.SECRET not in repr(battery.result)
    assert battery.processes_left == [], "a sandboxed process outlived its grading call"
    assert not battery.workers_replaced, battery.result.errors
    assert battery.job_dirs_left == []
    assert battery.host_files_ok
    assert battery.connections_seen == 0
    assert battery.wall_s < 60, f"battery took {battery.wall_s:.1f} s"


def test_killed_workers_job_folder_is_removed():
    """The pool kills a worker mid-run (its 1.5 s deadline before the sandbox's 20 s one): the
    job folder the worker had made must not stay behind."""
    require_sandbox()
    seen: list[str] = []
    with GraderPool(1, timeout_s=1.5) as pool:
        pool.grade(code_reward, [fenced("def f():\n    return 'pwned'")], [default_limits_example()])
        temp_dir, = worker_temp_dirs(pool)
        stop = threading.Event()

        def watch():
            while not stop.is_set():
                try:
                    seen.extend(name for name in os.listdir(temp_dir) if name.startswith("jaxrl-sandbox-"))
                except FileNotFoundError:  # removed with its killed worker
                    return
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        sleeper = CodeExample(answer="", metadata={"tests": [PWNED_TEST], "sandbox": {"wall_s": 20, "cpu_s": 20}})
        result = pool.grade(code_reward, [fenced("import time\ntime.sleep(30)")], [sleeper])
        stop.set()
        watcher.join()
        assert result.statuses == ("timeout",)
        assert seen, "the job folder never appeared in the worker's temporary folder"
        assert not os.path.exists(temp_dir), f"{temp_dir} outlived its killed worker: {os.listdir(temp_dir)}"


def run_classic_bpf(program, data: bytes) -> int:
    """A second formulation of the kernel's classic-BPF interpreter, for the 4 opcodes used."""
    pc, accumulator = 0, 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x20:  # load a 32-bit word at k
            accumulator = int.from_bytes(data[k:k + 4], "little")
        elif code in (0x15, 0x35):  # jump if equal / greater or equal
            taken = accumulator == k if code == 0x15 else accumulator >= k
            pc += jt if taken else jf
        elif code == 0x06:
            return k
        pc += 1


def seccomp_data(arch: int, nr: int, *args: int) -> bytes:
    args = list(args) + [0] * (6 - len(args))
    return (nr.to_bytes(4, "little") + arch.to_bytes(4, "little") + bytes(8)
            + b"".join(a.to_bytes(8, "little") for a in args))


@pytest.mark.parametrize("machine, arch, setsockopt", [("x86_64", 0xC000003E, 54), ("aarch64", 0xC00000B7, 208)])
def test_socket_buffer_filter_refuses_only_buffer_raises(machine, arch, setsockopt):
    program = socket_buffer_filter(machine)
    allow, eperm, enosys = 0x7FFF0000, 0x50001, 0x50026
    verdict = lambda *call: run_classic_bpf(program, seccomp_data(*call))  # noqa: E731
    for optname in (7, 8, 32, 33):  # SO_SNDBUF, SO_RCVBUF, and the FORCE variants
        assert verdict(arch, setsockopt, 3, 1, optname) == eperm
        assert verdict(arch, setsockopt, 3, 1 | (1 << 32), optname | (5 << 32)) == eperm  # high words ignored
    assert verdict(arch, setsockopt, 3, 1, 2) == allow  # SO_REUSEADDR
    assert verdict(arch, setsockopt, 3, 6, 7) == allow  # IPPROTO_TCP level, same number
    assert verdict(arch, 0, 3, 1, 7) == allow  # another syscall with the same arguments
    assert verdict(0x40000003, setsockopt, 3, 1, 7) == enosys  # i386
    assert verdict(arch, 0x40000000 | 541, 3, 1, 7) == enosys  # x32's setsockopt
    assert socket_buffer_filter("riscv64") is None


def test_memory_bound_sums_the_caps():
    """The documented bound at the default limits, summed by hand from the numbers in the docs."""
    limits = SandboxLimits()
    bound = memory_bound_mb(limits)
    pipe_half = int(open("/proc/sys/fs/pipe-max-size").read()) / 2
    socket_buffer = 2 * max(int(open(f"/proc/sys/net/core/{n}").read()) for n in ("wmem_default", "rmem_default"))
    by_hand = 16 * 512 + 64 + 4096 / 1024 + 16 + 16 * 16 / 1024 + 16 * 64 * max(pipe_half, socket_buffer) / MB
    assert bound["total"] == pytest.approx(by_hand)
    assert IPC_SYSCTLS["kernel/shmall"] * PAGE == 16 * MB
