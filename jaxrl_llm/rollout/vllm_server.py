"""Start and stop a vLLM OpenAI-compatible server as a subprocess.

    with VLLMServer(VLLMServerConfig(model_dir=hf_dir, dtype="float32")) as server:
        client = VLLMClient([server.url])

The server runs in its own Python environment (`vllm_env.vllm_python()`), in
its own session (process group), so stopping it also stops vLLM's engine-core
child processes: SIGTERM to the group, then SIGKILL after a grace period.

Flags that matter for RL:
  --logprobs-mode processed_logprobs  the sampled token's logprob is taken
      after temperature (and top-k/top-p), i.e. the mu the sample was
      actually drawn from (docs/objectives.md#sampler-support).
  --generation-config vllm  ignore the model's generation_config.json, whose
      sampling defaults (temperature, top_p) would silently apply to any
      request field we left out.
  --no-enable-chunked-prefill  every prompt is prefilled in one scheduler
      step (see VLLMServerConfig.chunked_prefill): on a CPU server a seeded
      request whose prefill is split kills the engine.
  VLLM_SERVER_DEV_MODE=1  enables /collective_rpc (reload_weights) and
      /reset_prefix_cache. These let any caller run worker methods, which is
      why a non-loopback host requires an API key.

When the server dies, `VLLMServer.crash_cause()` names the exception from its
log (`server_log.last_exception_line`), so callers report the cause, not just "connection
refused".
"""
from __future__ import annotations

import dataclasses
import errno
import ipaddress
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import requests

from jaxrl_llm.rollout import vllm_env
from jaxrl_llm.rollout.server_log import START_DIAGNOSES, crash_hint, last_exception_line

DTYPES = ("float32", "bfloat16", "float16", "auto")
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs")
# vLLM's defaults for an OpenAI server on CPU (vllm/engine/arg_utils.py
# get_batch_defaults): tokens per scheduler step, and sequences per step.
VLLM_CPU_DEFAULT_BATCHED_TOKENS = 2048
VLLM_CPU_DEFAULT_MAX_NUM_SEQS = 128


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
      chunked_prefill: let vLLM split a prompt's prefill over several
        scheduler steps. Off by default, because on CPU it kills the server
        as soon as a seeded request is split: vLLM samples a token for every
        scheduled request, throws it away when the request's prefill is not
        finished, and rewinds that request's seeded torch generator with
        `gen.set_offset(gen.get_offset() - 4)`
        (vllm/v1/worker/gpu_model_runner.py, `_bookkeeping_sync`). CPU
        generators have no offset ("RuntimeError: CPU Generator does not use
        offset"), and every RL rollout is seeded. With it off, vLLM admits a
        waiting prompt only when its whole prefill fits in the step's token
        budget; otherwise that prompt, and the ones queued after it, wait for
        the next step. A budget alone cannot prevent the split: with chunked
        prefill on, the scheduler fills whatever budget is left with a piece
        of the next prompt. Safe to turn on for a GPU server.
      max_num_batched_tokens: tokens one scheduler step may process; None
        means max(max_model_len, 2048), 2048 being vLLM's CPU default.
        Without chunked prefill it must be >= max_model_len (a longer prompt
        could never be scheduled, and vLLM refuses to start).
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
    chunked_prefill: bool = False
    max_num_batched_tokens: int | None = None
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
        self._check_batching()
        if self.port is not None and not (0 < self.port < 65536):
            raise ValueError(f"port must be in 1..65535 or None, got {self.port!r}")
        if not is_loopback(self.host) and not self.api_key:
            raise ValueError(
                f"host {self.host!r} is not a loopback address: the server's dev endpoints "
                "(/collective_rpc) let any caller run code on it, so api_key is required. Use "
                "host='127.0.0.1' or pass api_key=...")

    @property
    def token_budget(self) -> int:
        """The --max-num-batched-tokens the server is started with."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return max(self.max_model_len, VLLM_CPU_DEFAULT_BATCHED_TOKENS)

    def _check_batching(self) -> None:
        """The limits vLLM would otherwise only report by failing to start."""
        if not isinstance(self.chunked_prefill, bool):
            raise ValueError(f"chunked_prefill must be True or False, got {self.chunked_prefill!r}")
        budget = self.max_num_batched_tokens
        if budget is None:
            return
        if not isinstance(budget, int) or budget < VLLM_CPU_DEFAULT_MAX_NUM_SEQS:
            raise ValueError(f"max_num_batched_tokens must be None or an int >= {VLLM_CPU_DEFAULT_MAX_NUM_SEQS} "
                             f"(vLLM's max_num_seqs on CPU), got {budget!r}")
        if not self.chunked_prefill and budget < self.max_model_len:
            raise ValueError(
                f"max_num_batched_tokens={budget} is below max_model_len={self.max_model_len}: without "
                "chunked prefill a prompt must fit into one step. Use max_num_batched_tokens >= "
                f"{self.max_model_len}, None, or a smaller max_model_len")


def check_model_limits(config: VLLMServerConfig) -> None:
    """Refuse a max_model_len beyond the model's max_position_embeddings
    before launching (vLLM would fail to start after loading for a minute)."""
    model_config = json.loads((Path(config.model_dir) / "config.json").read_text())
    limit = model_config.get("max_position_embeddings")
    if isinstance(limit, int) and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's max_position_embeddings="
                         f"{limit} ({config.model_dir}/config.json); use max_model_len <= {limit}")


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
        "--max-num-batched-tokens", str(config.token_budget),
        "--enable-chunked-prefill" if config.chunked_prefill else "--no-enable-chunked-prefill",
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
        check_model_limits(config)
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
        with warnings.catch_warnings():
            # JAX warns on every fork; the child here only calls prctl and then exec.
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
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

    def log_text(self, max_bytes: int = 16 << 20) -> str:
        """The server log (its last max_bytes), or "" before there is one."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as log:
            log.seek(max(0, self.log_path.stat().st_size - max_bytes))
            return log.read().decode(errors="replace")

    def log_tail(self, num_lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.exists():
            return "(no log)"
        return "\n".join(self.log_text(1 << 20).splitlines()[-num_lines:])

    def crash_cause(self) -> str | None:
        """The exception line that explains a crash (see last_exception_line),
        followed by what to change when the cause is a known one."""
        cause = last_exception_line(self.log_text())
        hint = crash_hint(cause)
        return f"{cause} ({hint})" if hint else cause

    def is_healthy(self, timeout_s: float = 5.0) -> bool:
        """Whether /health answers 200 (it answers 503 once the engine died)."""
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        try:
            return requests.get(self.url + "/health", timeout=timeout_s, headers=headers).status_code == 200
        except requests.RequestException:
            return False

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
