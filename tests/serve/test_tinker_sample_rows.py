"""A sample call holds one prompt: the server's sampler prefills one prompt row for it, not the
sampler's default batch bucket of 8 (service.SAMPLE_BATCH_BUCKET; 3x less sampling time per call
for SmolLM2 on a 2-core CPU, docs/tinker.md). The rows are read at the sampler's jitted
`_generate`, the program a call runs, through the pinned SDK."""
from __future__ import annotations


def test_a_one_prompt_sample_call_prefills_one_row(service_client, monkeypatch):
    from tinker import types

    from jaxrl_llm.rollout import jax_sampler

    shapes, generate = [], jax_sampler._generate

    def recording(params, model, tokens, *args, **kwargs):
        shapes.append(tuple(tokens.shape))
        return generate(params, model, tokens, *args, **kwargs)

    monkeypatch.setattr(jax_sampler, "_generate", recording)
    base = service_client.get_server_capabilities().supported_models[0].model_name
    client = service_client.create_lora_training_client(base_model=base, rank=4, seed=3).result()
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=3, seed=11, temperature=1.0, stop=[])  # no EOS: 3 tokens each
    result = sampler.sample(types.ModelInput.from_ints([5, 6, 7, 8, 9]), 3, params).result()
    assert len(result.sequences) == 3 and all(len(s.tokens) == 3 for s in result.sequences)
    assert [rows for rows, _ in shapes] == [1]  # one prompt row (the 3 samples copy its prefill)
