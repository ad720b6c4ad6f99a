"""Start and stop a vLLM OpenAI-compatible server as a subprocess.

    with VLLMServer(VLLMServerConfig(model_dir=hf_dir, dtype="float32")) as server:
        client = VLLMClient([server.url])

The server runs in its own Python environment (`vllm_env.vllm_python()`), in
its own session (process group), so stopping it also stops vLLM's engine-core
child processes: SIGTERM to the group, then SIGKILL after a grace period.

Flags that matter for RL:
  --logprobs-mode processed_logprobs  the sampled token's logprob is taken
      after temperature (and top-k/top-p), i.e. the mu the sample was
      actually drawn from (SPEC 5).
  --generation-config vllm  ignore the model's generation_config.json, whose
      sampling defaults (temperature, top_p) would silently apply to any
      request field we left out.
  VLLM_SERVER_DEV_MODE=1  enables /collective_rpc (reload_weights) and
      /reset_prefix_cache. These let any caller run worker methods, which is
      why a non-loopback host requires an API key.
"""
from __future__ import annotations

import dataclasses
import errno
import ipaddress
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Mapping, Sequence

import requests

from jaxrl_llm.rollout import vllm_env

DTYPES = ("float32", "bfloat16", "float16", "auto")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")


class VLLMServerError(RuntimeError):
    """The vLLM server failed to start or died."""


class PortInUseError(VLLMServerError):
    """The requested host:port is already bound by another process."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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


def check_model_dir(model_dir: Path) -> None:
    """The server needs an HF-format directory: config.json, safetensors, tokenizer."""
    if not model_dir.is_dir():
        raise FileNotFoundError(f"model directory {model_dir} does not exist; expected an HF-format "
                                "directory (config.json, *.safetensors, tokenizer files), e.g. from "
                                "jaxrl_llm.bridge.save_hf_dir")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"model directory {model_dir} has no config.json; expected an HF-format "
                                "directory (config.json, *.safetensors, tokenizer files)")
    if not any(model_dir.glob("*.safetensors")):
        raise FileNotFoundError(f"model directory {model_dir} has no *.safetensors weight files")


def _terminate_with_parent() -> None:
    """In the child before exec: ask Linux to SIGTERM the server when the process that
    launched it dies (even by SIGKILL or the OOM killer), so no server outlives its
    owner holding a port and gigabytes of memory. Linux ties this to the launching
    *thread*: start servers from a thread that lives as long as they should (the main
    thread in practice). No-op where prctl is unavailable."""
    try:
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except OSError:
        pass


@dataclasses.dataclass(frozen=True)
class VLLMServerConfig:
    """How to run one vLLM server.

    Attributes:
      model_dir: HF-format model directory (config, safetensors, tokenizer).
      host: bind address; loopback by default. Anything else needs api_key.
      port: TCP port; None picks a free one.
      dtype: "float32", "bfloat16", "float16" or "auto".
      max_model_len: context length (prompt + completion).
      kv_cache_gib: VLLM_CPU_KVCACHE_SPACE in GiB (integer, CPU backend).
      api_key: bearer token the server requires (required off loopback).
      seed: server-wide seed.
      enforce_eager: skip torch.compile. On CPU this starts in about a third
        of the time (no ~1-2 min inductor compile, which vLLM 0.32 redoes on
        every start here) and generates ~20-30% slower: right for tests and
        short jobs, wrong for long training runs.
      logprobs_mode: "processed_logprobs" (after temperature; what RL needs)
        or "raw_logprobs".
      dev_mode: set VLLM_SERVER_DEV_MODE=1 (weight reload endpoints).
      served_model_name: the model name requests must use.
      startup_timeout_s: how long to wait for /health.
      log_path: server log file; None writes into a fresh temp directory.
      python: interpreter with vLLM; None uses vllm_env.vllm_python().
      extra_args: more CLI flags for the api_server.
      extra_env: more environment variables for the server process.
    """

    model_dir: str | Path
    host: str = "127.0.0.1"
    port: int | None = None
    dtype: str = "bfloat16"
    max_model_len: int = 1024
    kv_cache_gib: int = 2
    api_key: str | None = None
    seed: int = 0
    enforce_eager: bool = False
    logprobs_mode: str = "processed_logprobs"
    dev_mode: bool = True
    served_model_name: str = "policy"
    startup_timeout_s: float = 600.0
    log_path: str | Path | None = None
    python: str | Path | None = None
    extra_args: Sequence[str] = ()
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {LOGPROBS_MODES}, got {self.logprobs_mode!r}")
        if not isinstance(self.max_model_len, int) or self.max_model_len < 2:
            raise ValueError(f"max_model_len must be an int >= 2, got {self.max_model_len!r}")
        if not isinstance(self.kv_cache_gib, int) or self.kv_cache_gib < 1:
            raise ValueError(f"kv_cache_gib must be an int >= 1 (VLLM_CPU_KVCACHE_SPACE is whole GiB), "
                             f"got {self.kv_cache_gib!r}")
        if self.port is not None and not (0 < self.port < 65536):
            raise ValueError(f"port must be in 1..65535 or None, got {self.port!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: the server's dev endpoints "
                "(/collective_rpc) let any caller run code on it, so api_key is required. Use "
                "host='127.0.0.1' or pass api_key=...")


def server_command(config: VLLMServerConfig, python: Path, port: int) -> list[str]:
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(Path(config.model_dir).resolve()),
        "--served-model-name", config.served_model_name,
        "--host", config.host,
        "--port", str(port),
        "--dtype", config.dtype,
        "--max-model-len", str(config.max_model_len),
        "--logprobs-mode", config.logprobs_mode,
        "--generation-config", "vllm",
        "--seed", str(config.seed),
        "--disable-uvicorn-access-log",
    ]
    if config.enforce_eager:
        cmd.append("--enforce-eager")
    if config.api_key:
        cmd += ["--api-key", config.api_key]
    return cmd + list(config.extra_args)


def server_env(config: VLLMServerConfig) -> dict[str, str]:
    env = dict(os.environ)
    # The learner's JAX/XLA variables mean nothing to vLLM; its own pins must win.
    for key in ("PYTHONPATH", "VIRTUAL_ENV", "XLA_FLAGS", "JAX_PLATFORMS"):
        env.pop(key, None)
    env.update({
        "VLLM_CPU_KVCACHE_SPACE": str(config.kv_cache_gib),
        "VLLM_SERVER_DEV_MODE": "1" if config.dev_mode else "0",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(config.extra_env)
    return env


# Log lines that explain a failed start better than a generic "exited".
_LOG_DIAGNOSES = (
    ("address already in use", "port {port} on {host} is already in use"),
    ("errno 98", "port {port} on {host} is already in use"),
    ("no such file or directory", "a path does not exist (model directory {model_dir}?)"),
    ("is not a valid model", "model directory {model_dir} is not a valid HF model"),
    ("out of memory", "out of memory (lower kv_cache_gib or max_model_len)"),
)


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
        self._stopped = False
        self.process = subprocess.Popen(
            server_command(config, python, self.port),
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=server_env(config), start_new_session=True,  # own process group: killpg stops all
            preexec_fn=_terminate_with_parent, cwd=str(self.log_path.parent))
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
        for needle, diagnosis in _LOG_DIAGNOSES:
            if needle in lowered:
                headline += ": " + diagnosis.format(**fields)
                error_type = PortInUseError if "already in use" in diagnosis else VLLMServerError
                break
        else:
            error_type = VLLMServerError
        return error_type(f"{headline}. Log {self.log_path}, last lines:\n{tail}")

    def log_tail(self, num_lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-num_lines:])

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
