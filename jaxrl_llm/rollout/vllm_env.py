"""Where the vLLM server's own Python environment lives.

vLLM runs in a separate virtual environment (its torch/transformers pins
would fight the learner's), built once per machine by
`launch/build_vllm_env.sh` into

    ${JAXRL_CACHE:-~/.cache/jaxrl_llm}/vllm-cpu-<hash>

where <hash> = sha256(requirements-cpu.txt bytes || constraints-cpu.txt
bytes)[:12]. This module computes the same path so the learner can launch
the server without being told where it is. `JAXRL_VLLM_PYTHON` overrides
everything (e.g. a GPU node's vLLM build, see
third_party/vllm/requirements-gpu.txt).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REQUIREMENTS_DIR = REPO_ROOT / "third_party" / "vllm"
REQUIREMENTS_FILES = ("requirements-cpu.txt", "constraints-cpu.txt")
BUILD_SCRIPT = REPO_ROOT / "launch" / "build_vllm_env.sh"
STAMP_NAME = ".jaxrl-build-complete"


class VLLMEnvNotFoundError(FileNotFoundError):
    """The vLLM server environment has not been built on this machine."""


def requirements_hash(requirements_dir: Path = REQUIREMENTS_DIR) -> str:
    """First 12 hex digits of sha256 over the pinned requirement files, in the
    same order and bytes as `cat requirements-cpu.txt constraints-cpu.txt |
    sha256sum` in launch/build_vllm_env.sh."""
    digest = hashlib.sha256()
    for name in REQUIREMENTS_FILES:
        path = Path(requirements_dir) / name
        if not path.is_file():
            raise FileNotFoundError(f"pinned vLLM requirements file {path} is missing; "
                                    f"expected {REQUIREMENTS_FILES} in {requirements_dir}")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def cache_dir() -> Path:
    return Path(os.environ.get("JAXRL_CACHE", Path.home() / ".cache" / "jaxrl_llm"))


def vllm_env_dir() -> Path:
    """Directory of the vLLM CPU environment for the current pins (it may
    not exist yet). `JAXRL_VLLM_ENV` overrides it, as in the build script."""
    override = os.environ.get("JAXRL_VLLM_ENV")
    if override:
        return Path(override)
    return cache_dir() / f"vllm-cpu-{requirements_hash()}"


def vllm_env_is_built() -> bool:
    if os.environ.get("JAXRL_VLLM_PYTHON"):
        return Path(os.environ["JAXRL_VLLM_PYTHON"]).is_file()
    return (vllm_env_dir() / STAMP_NAME).is_file()


def vllm_python() -> Path:
    """Python interpreter of a complete vLLM environment.

    Raises:
      VLLMEnvNotFoundError: nothing built for the current pins (a directory
        without the completion stamp is a crashed build and does not count).
    """
    override = os.environ.get("JAXRL_VLLM_PYTHON")
    if override:
        if not Path(override).is_file():
            raise VLLMEnvNotFoundError(f"JAXRL_VLLM_PYTHON={override} is not a file; point it at the "
                                       "python of an environment with vLLM installed")
        return Path(override)
    env_dir = vllm_env_dir()
    if not (env_dir / STAMP_NAME).is_file():
        raise VLLMEnvNotFoundError(
            f"no complete vLLM environment at {env_dir} (missing {STAMP_NAME}); "
            f"build it with `{BUILD_SCRIPT}` or `make vllm-env`")
    return env_dir / "bin" / "python"
