"""Overlapped weight verification (`DiskWeightSync.push_overlapped`, `VLLMEngine(overlap_verify=True)`)
against the session's real vLLM CPU server (float32, SmolLM2).

The learner side of each comparison is our JAX decoder's log-probs (`learner_logprobs`), an
implementation independent of vLLM. The module ends with the server back on the base weights.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jaxrl_llm.rollout import (DiskWeightSync, LogprobProbe, PendingPush, SamplingParams, UnverifiedWeightsError,
                               VLLMClient, VLLMEngine, WeightSyncError, bridge_export)

pytestmark = pytest.mark.vllm

FP32_ATOL = 2e-3  # float32 server vs float32 JAX decoder: same math, other kernels


@pytest.fixture(scope="module")
def setup(vllm_server, smollm2, chat_prompts, learner_logprobs):
    """(server, prompts, probe); the server is reset to the base weights afterwards."""
    server = vllm_server.get()
    prompts = chat_prompts(3, 24)
    probe_ids = prompts[0]
    probe = LogprobProbe(probe_ids, lambda p: learner_logprobs(p, [probe_ids])[0], atol=FP32_ATOL)
    yield server, prompts, probe
    with DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg)) as restore:
        restore.push(smollm2.params, 0)


def _scaled_down_proj(params, layer: int = 5, scale: float = 3.0):
    layers = dict(params["layers"], down_proj=params["layers"]["down_proj"].at[layer].multiply(scale))
    return dict(params, layers=layers)


def test_overlapped_push_serves_exactly_the_new_weights(setup, smollm2, learner_logprobs):
    server, prompts, probe = setup
    client = VLLMClient([server.url])
    new = _scaled_down_proj(smollm2.params)
    check = prompts[1] + [9302, 305, 570, 314, 2]  # an independent sequence, not the probe
    learner_old, learner_new = (learner_logprobs(p, [check])[0] for p in (smollm2.params, new))
    assert np.abs(learner_new - learner_old).max() > 0.1  # the change matters

    with DiskWeightSync(client, bridge_export(smollm2.cfg), probe=probe) as sync:
        pending = sync.push_overlapped(new, 1)
        assert isinstance(pending, PendingPush) and pending.version == 1
        report = pending.result()
        assert report.probe_max_abs_diff <= FP32_ATOL and report.verify_s > 0
        served = client.prompt_logprobs(check)
        assert np.abs(served - learner_new).max() < FP32_ATOL
        assert np.abs(served - learner_old).max() > 0.1

        # Through the engine: the batch leaves generate only after its weights' probe, and was
        # sampled by exactly them (the server's sampler logprobs are the learner's for `new`).
        engine = VLLMEngine(client, sync, servers=[server], initial_version=1, overlap_verify=True)
        assert engine.update_weights(smollm2.params) == 2
        assert engine.update_weights(new) == 3  # waits for version 2's probe first
        batch = engine.generate(prompts[2:3], 2, SamplingParams(max_tokens=6, seed=0))
        assert [r.weight_version for r in batch] == [3, 3]
        assert engine.last_sync.version == 3 and engine.last_sync.probe_max_abs_diff <= FP32_ATOL
        assert engine.last_verify_wait_s >= 0
        for record in batch:
            sequence = list(record.prompt_token_ids) + list(record.completion_token_ids)
            learner = learner_logprobs(new, [sequence])[0][len(record.prompt_token_ids) - 1:]
            assert np.abs(np.asarray(record.sampler_logprobs) - learner).max() < FP32_ATOL
        print(f"\noverlapped push: export {report.export_s:.2f} s, reload {report.reload_s:.2f} s, probe "
              f"{report.verify_s:.2f} s in the background (diff {report.probe_max_abs_diff:.1e}); the "
              f"engine's generate waited {engine.last_verify_wait_s:.3f} s for it")


def test_failed_overlapped_probe_discards_the_batch_and_later_generates_refuse(setup, smollm2):
    server, prompts, probe = setup
    client = VLLMClient([server.url])
    export_all = bridge_export(smollm2.cfg)
    broken = {"on": True}

    def export(params, directory):  # vLLM only logs a warning for the tensor it does not find
        export_all(params, directory)
        if broken["on"]:
            path = Path(directory) / "model.safetensors"
            tensors = load_file(path)
            del tensors["model.layers.5.mlp.down_proj.weight"]
            save_file(tensors, path)

    sampling = SamplingParams(max_tokens=4, seed=0)
    with DiskWeightSync(client, export, probe=probe) as sync:
        engine = VLLMEngine(client, sync, servers=[server], initial_version=7, overlap_verify=True)
        # The server keeps its own layer-5 down_proj (base or x3), which this scale differs from.
        assert engine.update_weights(_scaled_down_proj(smollm2.params, scale=0.25)) == 8  # installed, unverified
        with pytest.raises(UnverifiedWeightsError, match=r"batch of 2 samples from weight version 8 was discarded"
                                                         r".*probe logprobs differ from the learner's by up to"):
            engine.generate(prompts[:1], 2, sampling)
        with pytest.raises(UnverifiedWeightsError, match=r"refusing to sample: the served weights \(version 8\) "
                                                         r"failed verification"):
            engine.generate(prompts[:1], 2, sampling)
        with pytest.raises(WeightSyncError, match="probe logprobs differ"):
            engine.wait_verified()  # the loop's check after a step sees the failure too
        broken["on"] = False  # pushing other (good) weights lets the engine sample again
        assert engine.update_weights(smollm2.params) == 9
        batch = engine.generate(prompts[:1], 2, sampling)
        assert [r.weight_version for r in batch] == [9, 9]
        assert engine.last_sync.version == 9 and engine.last_sync.probe_max_abs_diff <= FP32_ATOL
