"""Starting and stopping the Tinker server: `jaxrl serve-tinker` runs `serve` in the foreground;
tests run a `RunningServer` (the same app on a uvicorn thread) beside the client in one process.

Security: the server listens on 127.0.0.1 by default. It requires an API key (X-API-Key; the SDK
demands a key that starts with "tml-") unless it runs in dev mode, which is refused on any address
other than loopback.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Sequence

import uvicorn

from jaxrl_llm.rollout.vllm_server_config import is_loopback
from jaxrl_llm.serve.tinker.app import build_app
from jaxrl_llm.serve.tinker.jobs import Jobs
from jaxrl_llm.serve.tinker.learner import MICRO_BATCH_TOKENS
from jaxrl_llm.serve.tinker.service import TinkerService, load_base_model

log = logging.getLogger(__name__)
API_KEY_ENV = "JAXRL_TINKER_API_KEY"


def check_access(host: str, api_key: str | None, dev: bool) -> str | None:
    """The key the server requires (None: dev mode); ValueError for an open or keyless setup."""
    if dev:
        if not is_loopback(host):
            raise ValueError(f"--dev (no API key) on host {host!r}; valid: dev mode on a loopback address "
                             "(127.0.0.1, ::1, localhost) only, or an API key")
        return None
    if not api_key:
        raise ValueError(f"no API key: set ${API_KEY_ENV} (e.g. tml-<random>) or pass --dev on loopback")
    if not api_key.startswith("tml-"):
        raise ValueError(f"${API_KEY_ENV} must start with 'tml-' (the tinker SDK refuses other keys)")
    return api_key


def build_service(base_models: Sequence[str], state_dir: str, seed: int = 0,
                  micro_batch_tokens: int = MICRO_BATCH_TOKENS) -> TinkerService:
    if not base_models:
        raise ValueError("no base model; valid: --base-model 'smollm2', an HF directory or a .gguf (repeatable)")
    return TinkerService({name: load_base_model(name, micro_batch_tokens) for name in base_models}, state_dir, seed=seed)


def serve(base_models: Sequence[str], *, host: str, port: int, state_dir: str, api_key: str | None,
          dev: bool, seed: int = 0, micro_batch_tokens: int = MICRO_BATCH_TOKENS) -> None:
    key = check_access(host, api_key, dev)
    service = build_service(base_models, state_dir, seed, micro_batch_tokens)
    jobs = Jobs()
    log.info("Tinker API on http://%s:%d (%s); base models: %s", host, port,
             "dev mode, no API key" if key is None else f"API key from ${API_KEY_ENV}", ", ".join(base_models))
    try:
        uvicorn.run(build_app(service, jobs, key), host=host, port=port, log_level="warning")
    finally:
        jobs.close()


@dataclasses.dataclass
class RunningServer:
    """The server on a background thread of this process (tests, notebooks); `stop()` ends it."""

    service: TinkerService
    jobs: Jobs
    url: str
    _server: uvicorn.Server
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)
        self.jobs.close()


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def start_in_thread(service: TinkerService, *, api_key: str | None = None, host: str = "127.0.0.1",
                    port: int | None = None) -> RunningServer:
    jobs = Jobs()
    port = port or free_port(host)
    config = uvicorn.Config(build_app(service, jobs, api_key), host=host, port=port, log_level="warning",
                            lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tinker-http", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError(f"the Tinker server did not start on {host}:{port}")
        time.sleep(0.02)
    return RunningServer(service, jobs, f"http://{host}:{port}", server, thread)


def api_key_from_env() -> str | None:
    return os.environ.get(API_KEY_ENV) or None
