"""Start and stop a vLLM OpenAI-compatible server as a subprocess.

    with VLLMServer(VLLMServerConfig(model_dir=hf_dir, dtype="float32")) as server:
        client = VLLMClient([server.url])

The server runs in its own Python environment (`vllm_env.vllm_python()`), in
its own session (process group), so stopping it also stops vLLM's engine-core
child processes: SIGTERM to the group, then SIGKILL after a grace period. A watcher
leads that group (`parent_watch.py`, see `launch_watched`): it ends the group when the
process that started the server dies. Its
settings, and the flags and environment they become, are in `vllm_server_config`.

When the server dies, `VLLMServer.crash_cause()` names the exception from its
log (`server_log.last_exception_line`), so callers report the cause, not just "connection
refused".
"""
from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests

from jaxrl_llm.rollout import vllm_env
from jaxrl_llm.rollout.server_log import START_DIAGNOSES, crash_hint, last_exception_line
from jaxrl_llm.rollout.vllm_server_config import (
    VLLMServerConfig,
    check_model_dir,
    check_model_limits,
    check_routing_model,
    server_command,
    server_env,
)


class VLLMServerError(RuntimeError):
    """The vLLM server failed to start or died."""


class PortInUseError(VLLMServerError):
    """The requested host:port is already bound by another process."""


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (another process could still take
    it before the server binds; `VLLMServer` detects that from the log)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def check_port_free(host: str, port: int) -> None:
    """Raise PortInUseError naming host:port if something is bound there."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                raise PortInUseError(
                    f"port {port} on {host} is already in use ({err.strerror}); pass a free port "
                    "or port=None to pick one") from err
            raise


PARENT_WATCH = Path(__file__).with_name("parent_watch.py")


def launch_watched(command: list[str], **popen_kwargs) -> subprocess.Popen:
    """Start `command` under `parent_watch.py`, in a new session (process group) that the
    watcher leads: when this process dies (even by SIGKILL or the OOM killer), from whatever
    thread it launched the command, the watcher ends the group, so no server outlives its owner
    holding a port and gigabytes of memory. The returned process is the watcher, whose pid is
    the group id and whose exit status is the command's. With JAXRL_VLLM_PID_DIR set (`make
    test`), the group id, command, working directory and test are recorded in a file there,
    for the check that none is left when the test run ends (tests/leftover_servers.py)."""
    watched = [sys.executable, "-I", str(PARENT_WATCH), str(os.getpid()), *command]
    process = subprocess.Popen(watched, start_new_session=True, **popen_kwargs)
    record = os.environ.get("JAXRL_VLLM_PID_DIR")
    if record and os.path.isdir(record):
        cwd = os.path.abspath(popen_kwargs.get("cwd") or os.getcwd())
        started_by = os.environ.get("PYTEST_CURRENT_TEST")  # set by pytest, inherited by the processes of a test
        Path(record, str(process.pid)).write_text(json.dumps({"pid": process.pid, "cwd": cwd, "command": command,
                                                              "test": started_by}))
    return process


class VLLMServer:
    """A running vLLM server subprocess; use as a context manager."""

    def __init__(self, config: VLLMServerConfig):
        self.config = config
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path: Path | None = None
        self._log_file = None
        self._shm_files: set[str] = set()
        self._stopped = False
        self._log_bytes_when_healthy = 0  # a traceback logged before the server last answered /health did not kill it

    @property
    def url(self) -> str:
        if self.port is None:
            raise VLLMServerError("server not started")
        return f"http://{self.config.host}:{self.port}"

    def start(self) -> "VLLMServer":
        """Launch the server and block until /health answers 200."""
        if self.is_running():
            raise VLLMServerError(f"server already running at {self.url}")
        config = self.config
        model_dir = Path(config.model_dir)
        check_model_dir(model_dir)
        check_model_limits(config)
        check_routing_model(config)
        if config.port is None:
            self.port = find_free_port(config.host)
        else:
            check_port_free(config.host, config.port)
            self.port = config.port
        python = Path(config.python) if config.python else vllm_env.vllm_python()
        if config.log_path is None:
            self.log_path = Path(tempfile.mkdtemp(prefix="vllm-server-")) / "server.log"
        else:
            self.log_path = Path(config.log_path)
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab", buffering=0)
        self._log_bytes_when_healthy = self.log_path.stat().st_size  # an earlier server's lines in an appended log
        self._stopped = False
        self.process = launch_watched(
            server_command(config, python, self.port),
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(config), cwd=str(self.log_path.parent))
        try:
            self._wait_healthy(config.startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self._shm_files |= _group_shm_files(self.process.pid)
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        while time.monotonic() < deadline:
            code = self.process.poll()
            if code is not None:
                raise self._start_failure(f"vLLM server exited with code {code} during startup")
            try:
                if requests.get(self.url + "/health", timeout=2, headers=headers).status_code == 200:
                    return
            except requests.RequestException:
                pass  # not listening yet
            time.sleep(0.5)
        raise self._start_failure(f"vLLM server did not become healthy within {timeout_s:.0f} s")

    def _start_failure(self, headline: str) -> VLLMServerError:
        tail = self.log_tail()
        lowered = tail.lower()
        fields = dict(port=self.port, host=self.config.host, model_dir=self.config.model_dir)
        for needle, diagnosis in START_DIAGNOSES:
            if needle in lowered:
                headline += ": " + diagnosis.format(**fields)
                error_type = PortInUseError if "already in use" in diagnosis else VLLMServerError
                break
        else:
            error_type = VLLMServerError
        cause = self.crash_cause()
        if cause:
            headline += f"\ncause: {cause}"
        return error_type(f"{headline}\nLog {self.log_path}, last lines:\n{tail}")

    def log_text(self, max_bytes: int = 16 << 20, since: int = 0) -> str:
        """The log's last `max_bytes`, from byte `since` on at the earliest."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(max(since, self.log_path.stat().st_size - max_bytes))
            return log.read().decode(errors="replace")

    def log_tail(self, num_lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_text(1 << 20).splitlines()[-num_lines:])

    def crash_cause(self) -> str | None:
        """The exception line that explains a crash (see last_exception_line),
        followed by what to change when the cause is a known one. Only what was logged after the
        server last answered /health counts: an earlier traceback (a request it refused, a failed
        /collective_rpc) did not stop it."""
        cause = last_exception_line(self.log_text(since=self._log_bytes_when_healthy))
        hint = crash_hint(cause)
        return f"{cause} ({hint})" if hint else cause

    def is_healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether /health answers 200 (it answers 503 once the engine died)."""
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        logged = self.log_path.stat().st_size if self.log_path is not None and self.log_path.exists() else 0
        try:
            healthy = requests.get(self.url + "/health", timeout=timeout_s, headers=headers).status_code == 200
        except requests.RequestException:
            return False
        if healthy:
            self._log_bytes_when_healthy = logged
        return healthy

    @property
    def shared_memory_files(self) -> frozenset[str]:
        """/dev/shm segments of this server, unlinked by stop() even after a crash."""
        return frozenset(self._shm_files)

    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def has_exited(self, within_s: float = 0.0) -> bool:
        """True if the process is gone, waiting up to within_s for it to go
        (a killed server can still be unreaped when its clients notice)."""
        if self.process is None:
            return False
        try:
            self.process.wait(timeout=within_s)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL the whole process group at once (simulates a crash)."""
        if self.process is not None and not self._stopped and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGKILL)

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the process group, SIGKILL it if still alive after grace_s."""
        proc = self.process
        if proc is not None and not self._stopped:
            self._stopped = True  # never signal this group id again: the id may be reused later
            self._shm_files |= _group_shm_files(proc.pid)
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace_s)
            # Engine-core children may outlive the API process; the group id
            # is the leader's pid, so this reaches them even after it exited.
            _signal_group(proc.pid, signal.SIGKILL)
        # vLLM's engine<->worker broadcast buffers live in /dev/shm; a killed
        # server cannot unlink them, so we do (only files its processes mapped).
        for path in self._shm_files:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self._shm_files = set()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> "VLLMServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_shm_files(pgid: int) -> set[str]:
    """Shared-memory segments mapped by the live processes of process group pgid."""
    found = set()
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != pgid:
                continue
            with open(f"/proc/{entry}/maps") as maps:
                for line in maps:
                    path = line.rstrip("\n").split(maxsplit=5)[-1]
                    # psm_*: multiprocessing.shared_memory segments (vLLM's
                    # broadcast queues, ~400 MB sparse); never weight files it
                    # merely mmaps. (A SIGKILLed server also leaves one 32-byte
                    # sem.mp-* semaphore that no process maps, so it cannot
                    # be attributed safely and is left alone.)
                    if path.startswith("/dev/shm/psm_") and " " not in path:
                        found.add(path)
        except (ProcessLookupError, PermissionError, FileNotFoundError, OSError):
            continue  # exited meanwhile, or not ours to read
    return found


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # already gone
