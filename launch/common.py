"""Pieces shared by the launch scripts: exact command lines (printed by --dry-run and run
otherwise), GPU lists, and running a set of vLLM servers + one learner process.

Only the standard library and `jaxrl_llm.rollout.vllm_server` (no JAX) are imported, so a
dry run is instant and runs anywhere.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Mapping, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from jaxrl_llm.rollout.vllm_server_config import QUIET_OFFLINE_ENV, VLLMServerConfig, server_command  # noqa: E402

# Environment every vLLM server gets (besides its GPUs), as rollout/vllm_server_config.server_env sets it.
VLLM_ENV = {"VLLM_SERVER_DEV_MODE": "1", **QUIET_OFFLINE_ENV}
# The learner's XLA/JAX variables mean nothing to vLLM and must not leak into it.
VLLM_UNSET = ("XLA_FLAGS", "JAX_PLATFORMS", "PYTHONPATH", "VIRTUAL_ENV")


def parse_ids(text: str, what: str) -> list[int]:
    """'0,1,4-7' -> [0, 1, 4, 5, 6, 7]; an error names the bad text."""
    ids: list[int] = []
    try:
        for part in (p.strip() for p in text.split(",") if p.strip()):
            lo, _, hi = part.partition("-")
            ids.extend(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        raise SystemExit(f"--{what}={text!r} is invalid; valid: ids like '0,1' or '4-7'") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise SystemExit(f"--{what}={text!r} is invalid; valid: distinct non-negative ids like '0,1' or '4-7'")
    return ids


def shell_line(env: Mapping[str, str], cmd: Sequence[str], unset: Sequence[str] = ()) -> str:
    """One copy-pasteable shell line: `env -u X K=V ... cmd ...`."""
    prefix = ["env", *[f"-u{name}" for name in unset], *[f"{k}={v}" for k, v in env.items()]] if env or unset else []
    return shlex.join([*prefix, *cmd])


def vllm_servers(model_dir: str, gpus: Sequence[int], *, gpus_per_server: int, base_port: int, python: str,
                 dtype: str, max_model_len: int, gpu_memory_utilization: float, seed: int,
                 host: str = "127.0.0.1") -> list[tuple[dict[str, str], list[str], str]]:
    """(env, command, url) of one vLLM server per `gpus_per_server` GPUs (tensor parallel
    inside a server), each on `host` with its own port base_port + i."""
    if len(gpus) % gpus_per_server:
        raise SystemExit(f"--gpus-per-server={gpus_per_server} does not divide the {len(gpus)} rollout GPUs "
                         f"{list(gpus)}; valid: a divisor of {len(gpus)}")
    servers = []
    for index in range(len(gpus) // gpus_per_server):
        own = gpus[index * gpus_per_server:(index + 1) * gpus_per_server]
        port = base_port + index
        # GPU generators can rewind, so chunked prefill is safe there (it is off by default for
        # CPU servers, whose seeded requests die on a split prefill) and keeps long prompts from
        # stalling decoding; 8192 tokens per step is vLLM's usual GPU serving budget.
        config = VLLMServerConfig(model_dir=model_dir, host=host, port=port, dtype=dtype,
                                  max_model_len=max_model_len, seed=seed, chunked_prefill=True,
                                  max_num_batched_tokens=max(8192, max_model_len),
                                  extra_args=("--tensor-parallel-size", str(gpus_per_server),
                                              "--gpu-memory-utilization", str(gpu_memory_utilization)))
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, own)), **VLLM_ENV}
        servers.append((env, server_command(config, Path(python), port), f"http://{host}:{port}"))
    return servers


def learner_command(python: str, config: str, overrides: Sequence[str], urls: Sequence[str] = (),
                    engine: str = "vllm", model_dir: str | None = None) -> list[str]:
    """`python -m jaxrl_llm.cli train --config C [model.source=M] rollout.engine=E
    [rollout.server_urls=...] overrides` (the servers and the learner start from one model)."""
    cmd = [python, "-m", "jaxrl_llm.cli", "train", "--config", config]
    if model_dir is not None:
        cmd.append(f"model.source={model_dir}")
    cmd.append(f"rollout.engine={engine}")
    if urls:
        cmd.append("rollout.server_urls=" + ",".join(urls))
    return cmd + list(overrides)


def wait_healthy(urls: Sequence[str], procs: Sequence[subprocess.Popen], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        for proc, url in zip(procs, urls):
            if proc.poll() is not None:
                raise SystemExit(f"vLLM server for {url} exited with code {proc.returncode} during startup")
        still = []
        for url in pending:
            try:
                with urllib.request.urlopen(url + "/health", timeout=2) as answer:
                    if answer.status != 200:
                        still.append(url)
            except OSError:
                still.append(url)
        pending = still
        if pending and time.monotonic() > deadline:
            raise SystemExit(f"vLLM servers {pending} not healthy after {timeout_s:.0f} s")
        if pending:
            time.sleep(2)


def run_servers_then_learner(servers, learner_env: Mapping[str, str], learner_cmd: Sequence[str], *,
                             log_dir: Path, startup_timeout_s: float) -> int:
    """Start every server (own process group, log file each), wait for /health, run the
    learner in the foreground, then stop the servers (SIGTERM, then SIGKILL)."""
    import signal

    log_dir.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for index, (env, cmd, _) in enumerate(servers):
            full_env = {k: v for k, v in os.environ.items() if k not in VLLM_UNSET}
            full_env.update(env)
            log = open(log_dir / f"vllm_{index}.log", "ab")
            procs.append(subprocess.Popen(cmd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True))
        wait_healthy([url for _, _, url in servers], procs, startup_timeout_s)
        return subprocess.call(list(learner_cmd), env={**os.environ, **learner_env})
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
