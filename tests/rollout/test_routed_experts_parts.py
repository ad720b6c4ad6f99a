"""Routed experts without a server: the record's shape rule, the client's check of what a server
returned, the server's flags (the server itself: test_vllm_routed_experts.py)."""
from __future__ import annotations

import base64
import io
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.rollout.routed_experts import RoutedExpertsError, decode_routed_experts, worker_results
from jaxrl_llm.rollout.types import RolloutRecord
from jaxrl_llm.rollout.vllm_client import completion_request_body
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.rollout.vllm_server_config import ROUTING_CAPTURE_EXTENSION, VLLMServerConfig, server_command, server_env


def _entry(rows: np.ndarray, start: int = 0) -> dict:
    with io.BytesIO() as buffer:
        np.save(buffer, rows)
        return {"start": start, "npy_b64": base64.b64encode(buffer.getvalue()).decode()}


def test_record_takes_one_routing_row_per_forwarded_token():
    """P = 2 prompt and L = 3 completion tokens: rows for positions 0..3 (4 = P + L - 1)."""
    rows = np.arange(4 * 2 * 2).reshape(4, 2, 2)
    record = RolloutRecord(0, 0, [1, 2], [5, 6, 7], [-1.0, -1.0, -1.0], "length", 0, routed_experts=rows)
    assert record.routed_experts.dtype == np.int32 and record.routed_experts.shape == (4, 2, 2)
    with pytest.raises(ValueError, match=r"routed_experts must be \[P \+ L - 1 = 4"):
        RolloutRecord(0, 0, [1, 2], [5, 6, 7], [-1.0, -1.0, -1.0], "length", 0, routed_experts=rows[:3])


def test_decode_checks_start_and_row_count():
    rows = np.arange(5 * 3 * 2, dtype=np.int16).reshape(5, 3, 2)
    np.testing.assert_array_equal(decode_routed_experts(_entry(rows), 4, 2, "s"), rows)
    with pytest.raises(RoutedExpertsError, match="positions 0..4 .* expected 0..5"):
        decode_routed_experts(_entry(rows), 4, 3, "sample 0 of prompt 1")
    with pytest.raises(RoutedExpertsError, match="positions 2..6"):
        decode_routed_experts(_entry(rows, start=2), 4, 2, "s")
    with pytest.raises(RoutedExpertsError, match="recorded no routed experts for sample 1"):
        decode_routed_experts(None, 4, 2, "sample 1")


def test_a_workers_error_is_raised_naming_the_server_and_option():
    with pytest.raises(RoutedExpertsError, match="return_routed_experts: server http://h:1: the served model has no"):
        worker_results([{"results": [{"error": "the served model has no MoE layer"}]}], ["http://h:1"], "m")
    assert worker_results([{"results": [{"0": 1}]}], ["u"], "m") == [{"0": 1}]


def test_request_names_its_routing_key_only_when_asked():
    params = SamplingParams(max_tokens=2)
    assert completion_request_body([1], 1, params, "policy", 0, routing_key="k")["vllm_xargs"] == {
        "jaxrl_routing_key": "k"}
    assert "vllm_xargs" not in completion_request_body([1], 1, params, "policy", 0)


def test_return_routed_experts_flags_and_environment(tmp_path):
    on = VLLMServerConfig(model_dir=tmp_path, return_routed_experts=True, enforce_eager=True)
    command = server_command(on, Path("python"), 8000)
    assert command[command.index("--worker-extension-cls") + 1] == ROUTING_CAPTURE_EXTENSION
    assert "--no-enable-prefix-caching" in command
    assert Path(server_env(on)["PYTHONPATH"], "jaxrl_routing_capture.py").is_file()
    off = VLLMServerConfig(model_dir=tmp_path)
    assert "--worker-extension-cls" not in server_command(off, Path("python"), 8000)
    assert "--no-enable-prefix-caching" not in server_command(off, Path("python"), 8000)
    assert "PYTHONPATH" not in server_env(off)
    with pytest.raises(ValueError, match="return_routed_experts=True needs dev_mode=True"):
        VLLMServerConfig(model_dir=tmp_path, return_routed_experts=True, enforce_eager=True, dev_mode=False)
    with pytest.raises(ValueError, match="return_routed_experts=True needs enforce_eager=True"):
        VLLMServerConfig(model_dir=tmp_path, return_routed_experts=True)
