"""Acceptance tests against a real vLLM CPU server serving real SmolLM2 weights.

The learner side of every comparison is our own JAX decoder
(jaxrl_llm.models.token_logprobs) — an implementation independent of vLLM.
"""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file
from tokenizers import Tokenizer

from jaxrl_llm.rollout import (
    DiskWeightSync,
    LogprobProbe,
    PortInUseError,
    SamplingParams,
    VLLMClient,
    VLLMEngine,
    VLLMRequestError,
    VLLMServer,
    VLLMServerConfig,
    VLLMServerError,
    WeightSyncError,
    bridge_export,
)
from jaxrl_llm.rollout import vllm_server as vllm_server_module

pytestmark = pytest.mark.vllm

EOS = 2  # <|im_end|>, SmolLM2's eos_token_id
QUESTIONS = ["What is 3 + 4? Answer with just the number.", "Name a colour.",
             "Write one word that rhymes with cat.", "What is 9 - 5? Answer with just the number."]
# float32 server vs float32 JAX decoder: same math, different kernels.
FP32_ATOL = 2e-3


def chat_ids(tokenizer: Tokenizer, question: str) -> list[int]:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return tokenizer.encode(text, add_special_tokens=False).ids


@pytest.fixture(scope="module")
def prompts(smollm2) -> list[list[int]]:
    tokenizer = Tokenizer.from_file(str(Path(smollm2.hf_dir) / "tokenizer.json"))
    return [chat_ids(tokenizer, q) for q in QUESTIONS]


@pytest.fixture()
def server(vllm_server) -> VLLMServer:
    return vllm_server.get()


def numpy_mismatch_metrics(sampler_logprobs: list[np.ndarray], learner_logprobs: list[np.ndarray]) -> dict:
    """The mismatch metrics (docs/objectives.md#mismatch-metrics) over all tokens, in numpy.
    d = log mu - log pi_old; k1 = mean d; k2 = mean d^2 / 2; k3 = mean(expm1(-d) + d)."""
    mu = np.concatenate(sampler_logprobs).astype(np.float64)
    pi = np.concatenate(learner_logprobs).astype(np.float64)
    d = mu - pi
    p_mu, p_pi = np.exp(mu), np.exp(pi)
    return {"k1": d.mean(), "k2": 0.5 * np.mean(d ** 2), "k3": np.mean(np.expm1(-d) + d),
            "max_abs_logprob_diff": np.abs(d).max(), "prob_diff_max": (p_mu - p_pi).max(),
            "prob_diff_min": (p_mu - p_pi).min(), "prob_pearson": np.corrcoef(p_mu, p_pi)[0, 1],
            "num_tokens": d.size}


def completion_logprobs_from_learner(learner_logprobs, params, batch, temperature) -> list[np.ndarray]:
    """The learner's log pi_old of each sampled completion token, recomputed from token ids."""
    sequences = [np.concatenate([r.prompt_token_ids, r.completion_token_ids]) for r in batch]
    full = learner_logprobs(params, sequences, temperature)
    return [lp[len(r.prompt_token_ids) - 1:] for lp, r in zip(full, batch)]


def test_samples_carry_exact_ids_and_sampler_logprobs_the_learner_reproduces(server, smollm2, prompts,
                                                                            learner_logprobs):
    engine = VLLMEngine(VLLMClient([server.url]), servers=[server])
    params = SamplingParams(temperature=0.8, max_tokens=24, seed=0)
    batch = engine.generate(prompts, n=4, params=params)

    assert (batch.num_prompts, batch.samples_per_prompt, len(batch)) == (4, 4, 16)
    for record in batch:
        np.testing.assert_array_equal(record.prompt_token_ids, prompts[record.prompt_index])
        assert record.weight_version == 0
        length = record.num_completion_tokens
        if record.finish_reason == "stop":
            assert record.completion_token_ids[-1] == EOS and length <= params.max_tokens
        else:
            assert record.finish_reason == "length" and length == params.max_tokens
            assert EOS not in record.completion_token_ids

    mu = [r.sampler_logprobs for r in batch]
    pi_at_temperature = completion_logprobs_from_learner(learner_logprobs, smollm2.params, batch, 0.8)
    metrics = numpy_mismatch_metrics(mu, pi_at_temperature)
    print("\nfloat32 server vs float32 learner mismatch:", {k: float(v) for k, v in metrics.items()})
    assert metrics["max_abs_logprob_diff"] < FP32_ATOL
    assert abs(metrics["k1"]) < 1e-4 and metrics["prob_pearson"] > 0.9999

    # The logprobs are *processed* (after temperature): at temperature 1 the
    # learner disagrees by far more than numerical noise.
    pi_at_one = completion_logprobs_from_learner(learner_logprobs, smollm2.params, batch, 1.0)
    assert numpy_mismatch_metrics(mu, pi_at_one)["max_abs_logprob_diff"] > 50 * FP32_ATOL

    # Second formulation: the core library's metrics agree with the numpy ones.
    from jaxrl_llm.core.corrections import mismatch_metrics
    _, mu_padded, mask = batch.padded_completions()
    pi_padded = np.zeros_like(mu_padded)
    for i, lp in enumerate(pi_at_temperature):
        pi_padded[i, :len(lp)] = lp
    core = {k: float(v) for k, v in mismatch_metrics(pi_padded, mu_padded, mask).items()}
    np.testing.assert_allclose([core["mismatch_k1"], core["mismatch_k2"], core["mismatch_prob_pearson"]],
                               [metrics["k1"], metrics["k2"], metrics["prob_pearson"]], rtol=1e-3, atol=1e-7)


@pytest.mark.slow
def test_bfloat16_server_mismatch_is_rounding_sized(vllm_env_built, smollm2, prompts, learner_logprobs, tmp_path):
    """A bfloat16 server (its own, started here) against the float32 learner:
    the mismatch must be far above float32 kernel noise (so the dtype switch
    really changes the sampler) yet stay a rounding effect, not a bug."""
    config = VLLMServerConfig(model_dir=smollm2.hf_dir, dtype="bfloat16", max_model_len=512, kv_cache_gib=1,
                              enforce_eager=True, log_path=tmp_path / "bf16.log")
    with VLLMServer(config) as bf16_server:
        batch = VLLMEngine(VLLMClient([bf16_server.url])).generate(
            prompts, n=4, params=SamplingParams(temperature=1.0, max_tokens=24, seed=0))
    mu = [r.sampler_logprobs for r in batch]
    pi = completion_logprobs_from_learner(learner_logprobs, smollm2.params, batch, 1.0)
    metrics = numpy_mismatch_metrics(mu, pi)
    print("\nbfloat16 server vs float32 learner mismatch:", {k: float(v) for k, v in metrics.items()})
    assert metrics["max_abs_logprob_diff"] > 10 * FP32_ATOL
    assert metrics["k2"] < 1e-2 and metrics["prob_pearson"] > 0.99


def test_seeded_sampling_is_reproducible_and_seed_dependent(server, prompts):
    client = VLLMClient([server.url])
    draw = lambda seed: client.sample(prompts[:2], 3, SamplingParams(max_tokens=8, seed=seed))
    first, again, other = draw(7), draw(7), draw(8)
    flat = lambda result: [s.token_ids.tolist() for group in result for s in group]
    assert flat(first) == flat(again)
    assert flat(first) != flat(other)
    # each sample of a prompt has its own seed (s + p*n + j), so a group is not n copies
    assert len({tuple(t) for t in flat(first)[:3]}) > 1


def test_a_request_the_server_rejects_fails_at_once_without_retries(server):
    client = VLLMClient([server.url], max_retries=3, backoff_s=5.0)
    too_long = [1] * 600  # max_model_len is 512; sent raw, past sample()'s own length check
    body = {"model": "policy", "prompt": too_long, "max_tokens": 4}
    started = time.monotonic()
    with pytest.raises(VLLMRequestError, match="HTTP 400"):
        client.post("/v1/completions", body)
    assert time.monotonic() - started < 5.0  # a retry would have slept 5 s


def _perturbed(params, layer: int = 5, scale: float = 3.0):
    layers = dict(params["layers"], down_proj=params["layers"]["down_proj"].at[layer].multiply(scale))
    return dict(params, layers=layers)


def test_weight_sync_serves_the_pushed_params_and_restores_exactly(server, smollm2, prompts,
                                                                  learner_logprobs):
    client = VLLMClient([server.url])
    probe_ids = prompts[0]
    probe = LogprobProbe(probe_ids, lambda p: learner_logprobs(p, [probe_ids])[0], atol=FP32_ATOL)
    sync = DiskWeightSync(client, bridge_export(smollm2.cfg), probe=probe)
    engine = VLLMEngine(client, sync, servers=[server])
    # An independent check sequence (not the probe): prompt 1 plus a fixed answer.
    check = prompts[1] + [9302, 305, 570, 314, EOS]
    served_before = client.prompt_logprobs(check)
    new_params = _perturbed(smollm2.params)
    learner_old = learner_logprobs(smollm2.params, [check])[0]
    learner_new = learner_logprobs(new_params, [check])[0]
    assert np.abs(learner_new - learner_old).max() > 0.1  # the perturbation matters

    try:
        assert engine.update_weights(new_params) == 1
        report = engine.last_sync
        print(f"\nweight sync (export {report.export_s:.2f} s, reload {report.reload_s:.2f} s, "
              f"verify {report.verify_s:.2f} s, probe diff {report.probe_max_abs_diff:.2e})")
        assert report.probe_max_abs_diff <= FP32_ATOL
        served_new = client.prompt_logprobs(check)
        assert np.abs(served_new - learner_new).max() < FP32_ATOL
        assert np.abs(served_new - learner_old).max() > 0.1
        assert client.get("/weight_info", url=server.url) == {"weight_version": "1"}
        batch = engine.generate(prompts[:1], 2, SamplingParams(max_tokens=4, seed=0))
        assert [r.weight_version for r in batch] == [1, 1]
        # Version 3 is written into version 1's staging file, in place (same inode): still exact.
        first_file = Path(report.weights_dir) / "model.safetensors"
        inode = first_file.stat().st_ino
        assert engine.update_weights(smollm2.params) == 2
        assert engine.update_weights(new_params) == 3
        assert (Path(engine.last_sync.weights_dir) / "model.safetensors").stat().st_ino == inode
        assert not first_file.exists() and len(list(Path(report.weights_dir).parent.iterdir())) == 2
        assert np.abs(client.prompt_logprobs(check) - learner_new).max() < FP32_ATOL
    finally:
        engine.update_weights(smollm2.params)
        sync.close()
    np.testing.assert_array_equal(client.prompt_logprobs(check), served_before)  # bit-exact restore


def test_probe_catches_an_export_that_silently_misses_a_tensor(server, smollm2, prompts, learner_logprobs):
    """vLLM only logs a warning for a tensor missing from a reload; the probe must fail."""
    client = VLLMClient([server.url])
    probe_ids = prompts[0]
    probe = LogprobProbe(probe_ids, lambda p: learner_logprobs(p, [probe_ids])[0], atol=FP32_ATOL)
    export_all = bridge_export(smollm2.cfg)

    def export_missing_down_proj_5(params, directory):
        export_all(params, directory)
        path = Path(directory) / "model.safetensors"
        tensors = load_file(path)
        del tensors["model.layers.5.mlp.down_proj.weight"]
        save_file(tensors, path)

    broken = DiskWeightSync(client, export_missing_down_proj_5, probe=probe)
    engine = VLLMEngine(client, broken, servers=[server], initial_version=5)
    served_before = client.prompt_logprobs(probe_ids)
    try:
        with pytest.raises(WeightSyncError, match=r"probe logprobs differ from the learner's by up to"):
            engine.update_weights(_perturbed(smollm2.params))
        assert engine.weight_version == 5  # a failed push does not advance the version
    finally:
        broken.close()
        good = DiskWeightSync(client, export_all, probe=probe)
        good.push(smollm2.params, 6)
        good.close()
    np.testing.assert_array_equal(client.prompt_logprobs(probe_ids), served_before)


def test_busy_port_is_also_detected_from_the_server_log(vllm_env_built, smollm2, tmp_path, monkeypatch):
    """If the port is taken between the pre-check and vLLM's bind, the log names it."""
    monkeypatch.setattr(vllm_server_module, "check_port_free", lambda host, port: None)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        config = VLLMServerConfig(model_dir=smollm2.hf_dir, port=port, enforce_eager=True,
                                  log_path=tmp_path / "busy.log", startup_timeout_s=300)
        server = VLLMServer(config)
        with pytest.raises(PortInUseError, match=f"port {port} on 127.0.0.1 is already in use"):
            server.start()
        assert not server.is_running()


def test_server_killed_mid_request_raises_clear_error(vllm_server, prompts):
    """Runs last (see conftest): it takes the shared server down."""
    server = vllm_server.get()
    timeout_s = 60.0
    engine = VLLMEngine(VLLMClient([server.url], request_timeout_s=timeout_s, max_retries=2, backoff_s=0.2),
                        servers=[server])
    outcome = {}

    def long_generation():
        try:
            engine.generate(prompts, n=8, params=SamplingParams(max_tokens=400, seed=0))
        except Exception as err:  # noqa: BLE001 - the test inspects it
            outcome["error"] = err
        outcome["finished_at"] = time.monotonic()

    thread = threading.Thread(target=long_generation, daemon=True)
    thread.start()
    time.sleep(3.0)  # 32 x 400 tokens take far longer than this
    assert thread.is_alive(), "generation finished before the server could be killed"
    killed_at = time.monotonic()
    server.kill()
    thread.join(timeout_s)
    assert not thread.is_alive(), f"client still waiting {timeout_s} s after the server died"
    error = outcome["error"]
    assert isinstance(error, VLLMServerError), repr(error)
    assert "vLLM server died" in str(error) and "exited with code -9" in str(error)
    # SIGKILL leaves no traceback in the log, and the error says so
    assert "no exception in its log" in str(error).splitlines()[0]
    assert outcome["finished_at"] - killed_at < 10.0
    print(f"\nerror {outcome['finished_at'] - killed_at:.2f} s after the kill: {str(error)[:300]}")

    # The crashed server's shared-memory segments are cleaned up by stop().
    segments = server.shared_memory_files
    assert segments and all(path.startswith("/dev/shm/") for path in segments)
    server.stop()
    assert not any(Path(path).exists() for path in segments)
