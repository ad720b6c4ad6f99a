"""Routed experts from a real vLLM CPU server (routing replay's sampler record, R3: Ma et al. 2025,
arXiv 2510.11370), checked against transformers' own router on the same tokens.

The server serves a tiny random Qwen3-MoE in float32; transformers' Qwen3MoeForCausalLM runs the
same weights in float32 on prompt + completion, and each layer's router top-k (a forward hook on
mlp.gate) must equal, token for token and in order, what the server recorded while sampling.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm import bridge
from jaxrl_llm.rollout import (RoutedExpertsError, SamplingParams, VLLMClient, VLLMEngine, VLLMServer,
                               VLLMServerConfig)
from tests.rollout.tiny_moe import TINY_QWEN3_MOE, router_top_k, save_tiny_qwen3_moe, tiny_qwen3_moe

pytestmark = pytest.mark.vllm

LAYERS, TOP_K = TINY_QWEN3_MOE["num_hidden_layers"], TINY_QWEN3_MOE["num_experts_per_tok"]
# Two prompts of different lengths (token ids of SmolLM2's vocabulary).
PROMPTS = [[1, 4093, 314, 253, 1345, 30, 2, 198], [1, 504, 3459, 282, 260, 4114, 314, 1075, 30, 5248, 28, 198]]


@pytest.fixture(scope="module")
def moe_model():
    return tiny_qwen3_moe(seed=0)


@pytest.fixture(scope="module")
def moe_server(vllm_env_built, moe_model, tmp_path_factory):
    root = Path(tmp_path_factory.mktemp("moe"))
    hf_dir = save_tiny_qwen3_moe(moe_model, root / "model")
    config = VLLMServerConfig(model_dir=hf_dir, dtype="float32", max_model_len=256, kv_cache_gib=1, enforce_eager=True,
                              return_routed_experts=True, log_path=root / "server.log", startup_timeout_s=900)
    with VLLMServer(config) as server:
        yield server


def test_routed_experts_equal_transformers_router_on_every_token(moe_server, moe_model):
    """Every row of every sample: the server's experts for token t of prompt + completion equal
    transformers' router top-k at position t (exactly, order included); P + L - 1 rows (the last
    sampled token is never forwarded)."""
    # max_concurrency = the prompt count: every pool thread is busy while it fetches routing
    with VLLMEngine(VLLMClient([moe_server.url], return_routed_experts=True, max_concurrency=2)) as engine:
        batch = engine.generate(PROMPTS, n=2, params=SamplingParams(max_tokens=10, seed=7, ignore_eos=True))
    assert len(batch) == 4
    for record in batch:
        tokens = np.concatenate([record.prompt_token_ids, record.completion_token_ids])
        assert record.routed_experts.shape == (len(tokens) - 1, LAYERS, TOP_K)
        assert record.routed_experts.dtype == np.int32
        np.testing.assert_array_equal(record.routed_experts, router_top_k(moe_model, tokens[:-1]))
    # not a degenerate router: every layer uses most of its 8 experts over the batch
    used = [np.unique(np.concatenate([r.routed_experts[:, layer] for r in batch])) for layer in range(LAYERS)]
    assert all(len(u) >= 6 for u in used), used


def test_routed_experts_are_none_unless_asked(moe_server):
    with VLLMEngine(VLLMClient([moe_server.url])) as engine:
        batch = engine.generate(PROMPTS[:1], n=1, params=SamplingParams(max_tokens=3, seed=1))
    assert batch.records[0].routed_experts is None


def test_client_refuses_a_server_that_does_not_record_routing(vllm_server, chat_prompts):
    """The shared SmolLM2 server runs without return_routed_experts: sampling with it asked for
    fails, naming the option, instead of returning records without routing."""
    client = VLLMClient([vllm_server.get().url], return_routed_experts=True, max_retries=0)
    with pytest.raises(RoutedExpertsError, match="return_routed_experts"):
        client.sample(chat_prompts(1, 16), n=1, params=SamplingParams(max_tokens=2, seed=0))
    client.close()
    assert vllm_server.get().is_healthy()  # the refused call left the shared server serving
    # Its worker logged the refused call's traceback; a later test that kills the shared server
    # checks that a SIGKILL leaves no traceback. The next test gets a fresh server, with a clean log.
    vllm_server.stop()


def test_server_refuses_return_routed_experts_for_a_dense_model(tmp_path):
    """SmolLM2 is dense: refused from its config.json before any process starts."""
    config = VLLMServerConfig(model_dir=bridge.smollm2_hf_dir(), return_routed_experts=True, enforce_eager=True,
                              log_path=tmp_path / "s.log")
    server = VLLMServer(config)
    with pytest.raises(ValueError, match="return_routed_experts=True needs a mixture-of-experts model"):
        server.start()
    assert server.process is None
