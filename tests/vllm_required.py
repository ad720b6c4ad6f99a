"""The vLLM tests need the vLLM server environment; without it they FAIL, naming the
cause and the fix. Skipping them is a deliberate choice: JAXRL_SKIP_VLLM=1 (README,
Testing)."""
from __future__ import annotations

import os

import pytest

SKIP_VARIABLE = "JAXRL_SKIP_VLLM"


def require_vllm_env() -> None:
    """Fails (or, with JAXRL_SKIP_VLLM=1, skips) when the vLLM environment is not built."""
    from jaxrl_llm.rollout import vllm_env

    if vllm_env.vllm_env_is_built():
        return
    where = os.environ.get("JAXRL_VLLM_PYTHON") or vllm_env.vllm_env_dir()
    cause = f"the vLLM server environment is not built ({where} has no complete build)"
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{cause}; skipped because {SKIP_VARIABLE}=1")
    pytest.fail(f"{cause}. Fix: run `make vllm-env` (launch/build_vllm_env.sh; ~3 min, ~3.5 GB, once per "
                f"machine) and look at its log if it fails; or set {SKIP_VARIABLE}=1 to skip the vLLM tests "
                "knowingly.", pytrace=False)
