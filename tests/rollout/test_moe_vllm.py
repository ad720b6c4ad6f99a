"""A Qwen3-MoE policy exported by OUR bridge and served by the real vLLM CPU server (fp32).

The model: tests/rollout/tiny_moe.py's random transformers Qwen3MoeForCausalLM (3 layers, 8
experts, top-2, head_dim 64 for vLLM's CPU attention), read into jaxrl_llm's params with
`bridge.load_hf_dir` and written back with `bridge.save_hf_dir`; the server starts from that
directory. Independent references: transformers' forward of the original model, and a
deliberately wrong export (two experts swapped) that the comparison must catch.

Then two RL steps of that policy through the server (`loop.train`, its own process,
tests/rollout/moe_sync_run.py): step 1's weights are pushed (`write_sync_dir` + reload) and the
loop's logprob probe verifies the reloaded MoE weights; step 2 samples from version 1.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import bridge
from jaxrl_llm.models import token_logprobs
from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, VLLMServer, VLLMServerConfig, bridge_export
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample.weight_check import PROBE_ATOL
from tests.models.hf_reference import torch
from tests.rollout.tiny_moe import tiny_qwen3_moe

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
# Token ids of SmolLM2's vocabulary: a chat-like prompt and a sentence (28 + 16 tokens).
SEQUENCES = [[1, 4093, 314, 253, 1345, 30, 2, 198, 504, 3459, 282, 260, 4114, 314, 1075, 30, 5248, 28, 198,
              12, 9, 33, 216, 1202, 7, 77, 1345, 30],
             [1, 504, 3459, 282, 260, 4114, 314, 1075, 30, 5248, 28, 198, 4093, 314, 253, 1345]]
# fp32 everywhere; the server's kernels sum in another order than XLA's (and than torch's). Measured:
# server vs our forward at most 7.6e-6 on these tokens (logprobs of size ~11, 3 layers; about 2^-17
# relative, a few float32 roundings); 1e-3 leaves >100x room for other CPUs' kernels, while a swapped
# pair of experts in one layer moved some logprob by 3.7 (asserted > 0.1 below).
ATOL = 1e-3


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(cfg, params, transformers model, our exported directory)."""
    root = Path(tmp_path_factory.mktemp("moe_export"))
    hf_model = tiny_qwen3_moe(seed=0)
    hf_model.save_pretrained(str(root / "transformers"))
    cfg, params = bridge.load_hf_dir(root / "transformers")
    assert cfg.is_moe and cfg.family == "qwen3_moe"
    out = bridge.save_hf_dir(cfg, params, root / "ours", tokenizer_dir=bridge.smollm2_hf_dir())
    return cfg, params, hf_model, out


@pytest.fixture(scope="module")
def moe_server(vllm_env_built, exported, tmp_path_factory):
    log = Path(tmp_path_factory.mktemp("moe_server")) / "server.log"
    config = VLLMServerConfig(model_dir=exported[3], dtype="float32", max_model_len=256, kv_cache_gib=1,
                              enforce_eager=True, log_path=log, startup_timeout_s=900)
    with VLLMServer(config) as server:
        yield server


def ours(cfg, params, sequence) -> np.ndarray:
    return np.asarray(token_logprobs(params, cfg, jnp.asarray([sequence], jnp.int32))[0], np.float64)


def transformers_logprobs(model, sequence) -> np.ndarray:
    with torch.no_grad():
        logits = model(torch.tensor([sequence])).logits[0].double()
    logp = torch.log_softmax(logits, dim=-1)[:-1]
    return logp.gather(1, torch.tensor(sequence[1:])[:, None])[:, 0].numpy()


def swap_experts(params, layer: int, a: int, b: int):
    """params with experts a and b of `layer` exchanged (gate, up, down; the router untouched)."""
    layers = dict(params["layers"])
    for name in ("expert_gate", "expert_up", "expert_down"):
        w = np.array(layers[name])
        w[layer, [a, b]] = w[layer, [b, a]]
        layers[name] = w
    return {**params, "layers": layers}


@pytest.mark.slow  # a server of its own: ~100 s with the start on 2 cores (make test-all; make test's budget)
def test_vllm_serves_our_exported_moe_with_our_logprobs(moe_server, exported):
    cfg, params, hf_model, _ = exported
    client = VLLMClient([moe_server.url])
    try:
        worst = 0.0
        for sequence in SEQUENCES:
            served, mine, ref = (client.prompt_logprobs(sequence).astype(np.float64), ours(cfg, params, sequence),
                                 transformers_logprobs(hf_model, sequence))
            assert served.shape == mine.shape == (len(sequence) - 1,)
            np.testing.assert_allclose(mine, ref, atol=1e-4)  # our forward = transformers (same weights)
            np.testing.assert_allclose(served, mine, atol=ATOL)
            worst = max(worst, float(np.max(np.abs(served - mine))))
        # The comparison can see an export error: the server reloaded with experts 0 and 1 of layer 0
        # swapped (an export that mixed up per-expert names) serves other logprobs.
        sync = DiskWeightSync(client, bridge_export(cfg))
        try:
            sync.push(swap_experts(params, 0, 0, 1), version=1)
            swapped = max(float(np.max(np.abs(client.prompt_logprobs(s) - ours(cfg, params, s)))) for s in SEQUENCES)
        finally:
            sync.push(params, version=0)
            sync.close()
        restored = max(float(np.max(np.abs(client.prompt_logprobs(s) - ours(cfg, params, s)))) for s in SEQUENCES)
    finally:
        client.close()
    print(f"\nserved vs ours: max |diff| {worst:.2e}; swapped experts {swapped:.3g}; restored {restored:.2e}")
    assert swapped > 100 * ATOL
    assert restored <= ATOL


@pytest.mark.slow  # ~70 s beside the module's server (2 RL steps in a child process that compiles the learner)
@pytest.mark.timeout(1200)
def test_two_rl_steps_of_a_moe_policy_through_vllm_push_verified_moe_weights(moe_server, exported, tmp_path):
    cfg, params = exported[:2]
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device, as `jaxrl train` on a laptop
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "tests.rollout.moe_sync_run", moe_server.url, exported[3], str(run_dir)]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:  # the server goes back to the base weights
        sync = DiskWeightSync(VLLMClient([moe_server.url]), bridge_export(cfg))
        sync.push(params, version=0)
        sync.close()
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["error"] is None, out["error"]
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    assert [r["weight_version"] for r in rows] == [0.0, 1.0]  # step 2 sampled from the weights pushed after step 1
    # each step's push (versions 1 and 2) was reloaded and passed the probe
    assert all(r["weight_probe_diff"] <= PROBE_ATOL["float32"] and r["time_verify_s"] > 0 for r in rows)
    # the push carried real changes: step 1 moved some weight by much more than float32 rounding
    assert out["largest_weight_change"] > 1e-4
    print(f"\nprobe diffs {[r['weight_probe_diff'] for r in rows]} (atol {PROBE_ATOL['float32']}); "
          f"largest weight change {out['largest_weight_change']:.3g}; rewards {[r['reward'] for r in rows]}")
