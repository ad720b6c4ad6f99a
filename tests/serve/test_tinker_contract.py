"""The Tinker API contract through the pinned `tinker` SDK (0.38), against a tiny random decoder.

Every expected number is derived outside the server: log-probs from `models.token_logprobs` on the
model directory loaded again (tied, as saved; the server serves it untied), losses from the
`core.losses` functions called directly or by hand formulas, samples checked against the reference
model's own log-probs. A fresh model's adapters have B = 0, so its outputs are the base model's.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.serve.tinker_setup import (API_KEY, TEXTS, WIDTH, datum, ids_of, reference_logprobs,
                                      reference_next_token_logprobs, rl_inputs)

def _new_client(service_client, seed: int = 1, rank: int = 4):
    base = service_client.get_server_capabilities().supported_models[0].model_name
    return service_client.create_lora_training_client(base_model=base, rank=rank, seed=seed).result()


def test_forward_logprobs_and_every_loss_match_core(service_client, tiny_model_dir, tokenizer):
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.core import losses as core

    client = _new_client(service_client)
    ids = [ids_of(tokenizer, t) for t in TEXTS]
    ref = [reference_logprobs(tiny_model_dir, i) for i in ids]
    weights = [np.linspace(0.0, 1.0, len(i) - 1, dtype=np.float32) for i in ids]
    rl = [rl_inputs(i, seed) for seed, i in enumerate(ids)]

    ce = client.forward([datum(i, weights=w.tolist()) for i, w in zip(ids, weights)], "cross_entropy").result()
    for out, expected in zip(ce.loss_fn_outputs, ref):
        np.testing.assert_allclose(out["logprobs"].to_numpy(), expected, atol=2e-5)
    by_hand = -sum(float(np.sum(w * r)) for w, r in zip(weights, ref))
    assert ce.metrics["loss:sum"] == pytest.approx(by_hand, rel=1e-5)

    config = {"clip_low_threshold": 0.7, "clip_high_threshold": 1.3}
    padded = [np.zeros((len(ids), WIDTH), np.float32) for _ in range(4)]  # logp, q, A, mask: one shape
    for row, (r, x) in enumerate(zip(ref, rl)):
        for array, values in zip(padded, (r, x["logprobs"], x["advantages"], np.ones(r.size))):
            array[row, :r.size] = values
    by_core = {"ppo": lambda lp, q, a, m: core.ppo_clip_loss(lp, q, a, m, eps_low=0.3, eps_high=0.3).loss,
               "cispo": lambda lp, q, a, m: core.cispo_loss(lp, q, a, m, eps_low=0.3, eps_high=0.3).loss}
    expected = {name: float(jax.jit(lambda *a, fn=fn: jnp.sum(fn(*a)))(*padded)) for name, fn in by_core.items()}
    expected["importance_sampling"] = -sum(float(np.sum(np.exp(r - np.asarray(x["logprobs"])) * x["advantages"]))
                                           for r, x in zip(ref, rl))
    data = [datum(i, **inputs) for i, inputs in zip(ids, rl)]
    for loss_fn, loss_config in (("importance_sampling", None), ("ppo", config), ("cispo", config)):
        out = client.forward(data, loss_fn, loss_config).result()
        assert out.metrics["loss:sum"] == pytest.approx(expected[loss_fn], rel=1e-4), loss_fn
        for datum_out, r in zip(out.loss_fn_outputs, ref):
            np.testing.assert_allclose(datum_out["logprobs"].to_numpy(), r, atol=2e-5)


def test_zero_weights_give_zero_loss_and_no_update(service_client, tokenizer):
    from tinker import types

    client = _new_client(service_client, seed=2)
    ids = ids_of(tokenizer, TEXTS[0])
    zero = datum(ids, weights=[0.0] * (len(ids) - 1))
    before = client.forward([zero], "cross_entropy").result()
    out = client.forward_backward([zero], "cross_entropy").result()
    assert out.metrics["loss:sum"] == 0.0
    client.optim_step(types.AdamParams(learning_rate=0.1)).result()
    after = client.forward([zero], "cross_entropy").result()
    np.testing.assert_array_equal(after.loss_fn_outputs[0]["logprobs"].to_numpy(),
                                  before.loss_fn_outputs[0]["logprobs"].to_numpy())


def test_optim_step_changes_own_logprobs_only(service_client, tokenizer):
    from tinker import types

    trained, other = _new_client(service_client, seed=3), _new_client(service_client, seed=4)
    ids = ids_of(tokenizer, TEXTS[1])
    example = datum(ids, weights=[1.0] * (len(ids) - 1))
    other_before = other.forward([example], "cross_entropy").result()
    first = trained.forward_backward([example], "cross_entropy").result()
    step = trained.optim_step(types.AdamParams(learning_rate=0.02)).result()
    assert step.metrics["grad_norm"] > 0
    second = trained.forward([example], "cross_entropy").result()
    assert second.metrics["loss:sum"] < first.metrics["loss:sum"] - 0.1  # the step lowered its own loss
    other_after = other.forward([example], "cross_entropy").result()
    np.testing.assert_array_equal(other_after.loss_fn_outputs[0]["logprobs"].to_numpy(),
                                  other_before.loss_fn_outputs[0]["logprobs"].to_numpy())


def test_sample_and_compute_logprobs(service_client, tiny_model_dir, tokenizer):
    from tinker import types

    client = _new_client(service_client, seed=5)
    assert client.get_info().model_data.tokenizer_id == tiny_model_dir
    sampler = client.save_weights_and_get_sampling_client().result()
    prompt = ids_of(tokenizer, TEXTS[0])
    params = types.SamplingParams(max_tokens=4, seed=7, temperature=1.0)
    first = sampler.sample(types.ModelInput.from_ints(prompt), 3, params, include_prompt_logprobs=True).result()
    again = sampler.sample(types.ModelInput.from_ints(prompt), 3, params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]  # seeded
    ref_prompt = reference_logprobs(tiny_model_dir, prompt)
    assert first.prompt_logprobs[0] is None
    np.testing.assert_allclose(first.prompt_logprobs[1:], ref_prompt, atol=2e-5)
    for seq in first.sequences:
        assert len(seq.tokens) == 4 and seq.stop_reason == "length"
        ref = reference_logprobs(tiny_model_dir, prompt + seq.tokens)[len(prompt) - 1:]
        np.testing.assert_allclose(seq.logprobs, ref, atol=1e-4)
    np.testing.assert_allclose(sampler.compute_logprobs(types.ModelInput.from_ints(prompt)).result()[1:],
                               ref_prompt, atol=2e-5)
    greedy = sampler.sample(types.ModelInput.from_ints(prompt), 1, types.SamplingParams(max_tokens=4, top_k=1)).result()
    assert greedy.sequences[0].tokens[0] == int(np.argmax(reference_next_token_logprobs(tiny_model_dir, prompt)))
    greedy_tokens = greedy.sequences[0].tokens
    stop_at = greedy_tokens[1]
    stopped = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                             types.SamplingParams(max_tokens=4, top_k=1, stop=[stop_at])).result().sequences[0]
    assert stopped.tokens == greedy_tokens[:greedy_tokens.index(stop_at) + 1] and stopped.stop_reason == "stop"
    text = tokenizer.decode(greedy_tokens[:3], skip_special_tokens=False)
    by_string = sampler.sample(types.ModelInput.from_ints(prompt), 1,
                               types.SamplingParams(max_tokens=4, top_k=1, stop=[text[-2:]])).result().sequences[0]
    assert tokenizer.decode(by_string.tokens, skip_special_tokens=False).endswith(text[-2:])
    assert len(by_string.tokens) <= 3 and by_string.stop_reason == "stop"


def test_checkpoints_and_named_samplers_round_trip(service_client, tokenizer):
    from tinker import types

    client = _new_client(service_client, seed=6)
    ids = ids_of(tokenizer, TEXTS[1])
    example = datum(ids, weights=[1.0] * (len(ids) - 1))
    client.forward_backward([example], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.02)).result()
    saved = client.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    state = client.save_state("after-one-step").result()
    sampler_path = client.save_weights_for_sampler("after-one-step").result().path
    assert state.path.endswith("/weights/after-one-step") and "/sampler_weights/" in sampler_path
    client.forward_backward([example], "cross_entropy").result()
    client.optim_step(types.AdamParams(learning_rate=0.02)).result()
    moved = client.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    assert np.max(np.abs(moved - saved)) > 1e-3
    client.load_state_with_optimizer(state.path).result()
    restored = client.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_array_equal(restored, saved)
    named = service_client.create_sampling_client(model_path=sampler_path)
    scored = named.compute_logprobs(types.ModelInput.from_ints(ids)).result()
    np.testing.assert_allclose(scored[1:], saved, atol=2e-5)
    resumed = service_client.create_training_client_from_state_with_optimizer(state.path).result()
    np.testing.assert_array_equal(
        resumed.forward([example], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy(), saved)


def test_a_retried_seq_id_runs_once(tinker_server, service_client, tokenizer):
    import httpx
    from tinker import types
    from tinker.proto.request_conv import forward_backward_request_to_proto

    client = _new_client(service_client, seed=8)
    ids = ids_of(tokenizer, TEXTS[0])
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=[datum(ids, weights=[1.0] * (len(ids) - 1))],
                                                          loss_fn="cross_entropy"),
        model_id=client.model_id, seq_id=10_000)
    body = forward_backward_request_to_proto(request).SerializeToString()
    headers = {"X-API-Key": API_KEY, "Content-Type": "application/x-protobuf"}
    runs = tinker_server.jobs.runs["forward_backward"]
    ids_seen = [httpx.post(f"{tinker_server.url}/api/v1/forward_backward", content=body, headers=headers,
                           timeout=30).json()["request_id"] for _ in range(3)]
    assert len(set(ids_seen)) == 1
    result = httpx.post(f"{tinker_server.url}/api/v1/retrieve_future", json={"request_id": ids_seen[0]},
                        headers={**headers, "Accept": "application/x-protobuf"}, timeout=60)
    assert result.headers["content-type"] == "application/x-protobuf"
    assert tinker_server.jobs.runs["forward_backward"] == runs + 1
