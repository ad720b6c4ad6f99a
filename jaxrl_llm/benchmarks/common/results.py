"""Where every benchmark's results go (the repository's top-level benchmarks/results/) and what a
result file records about its run: the commit that ran and a file-name slug of the device."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RESULTS_DIR = REPO / "benchmarks" / "results"


def git_commit() -> str:
    """GPU_CHECK_COMMIT (set by launch/gpu_check.sh: a device's copy may hold a stale .git), else git's HEAD."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_slug(kind: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in kind.lower()).strip("-").replace("--", "-") or "device"
