"""ReMax's greedy rows and a GDPO run through the real vLLM CPU server (SmolLM2, float32).

Cheap (make test): a temperature-0 request returns transformers' greedy continuation, the same
for every seed, with logprobs equal to the JAX decoder's at temperature 1. Slow
(make test-all): 2-step `jaxrl train` runs of recipe.name=remax and recipe.name=gdpo on vLLM."""
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.types import SamplingParams
from tests.rollout.vllm_runs import train_two_steps_on_server

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]
FP32_ATOL = 2e-3  # float32 server vs float32 JAX decoder (as in test_vllm_server.py)
MAX_TOKENS = 6


def test_temperature_zero_through_vllm_is_transformers_greedy(vllm_server, smollm2, chat_prompts, learner_logprobs):
    import torch
    import transformers

    prompts = chat_prompts(2, 24)
    engine = VLLMEngine(VLLMClient([vllm_server.get().url]))
    # n = 1: vLLM refuses n > 1 with greedy sampling (identical rows); ReMax asks for one per prompt
    runs = [engine.generate(prompts, 1, SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, seed=s))
            for s in (1, 2)]
    model = transformers.AutoModelForCausalLM.from_pretrained(smollm2.hf_dir, dtype=torch.float32)
    for p, prompt in enumerate(prompts):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=MAX_TOKENS, pad_token_id=0)
        want = out[0, len(prompt):].tolist()
        for run in runs:
            record = run.records[p]
            assert record.completion_token_ids.tolist() == want[:record.num_completion_tokens]
        record = runs[0].records[p]
        learner = learner_logprobs(smollm2.params, [list(prompt) + record.completion_token_ids.tolist()])[0]
        np.testing.assert_allclose(record.sampler_logprobs, learner[len(prompt) - 1:], atol=FP32_ATOL)


@pytest.mark.slow  # two `jaxrl train` runs, ~70 s each on 2 cores
@pytest.mark.parametrize("extra, metric", [
    (["recipe.name=remax"], "baseline_reward"),
    (["recipe.name=gdpo", "task.reward_fns=[addition, tests.train.user_plugins:tenths_of_length_reward]",
      "task.reward_weights=[1.0, 0.5]"], "reward_tenths_of_length_reward"),
])
def test_two_steps_of_remax_and_gdpo_through_vllm(vllm_server, smollm2, tmp_path, extra, metric):
    rows = train_two_steps_on_server(vllm_server.get(), smollm2, tmp_path / "run", *extra)
    assert [r["step"] for r in rows] == [1, 2] and [r["weight_version"] for r in rows] == [0.0, 1.0]
    for r in rows:
        assert np.isfinite(r[metric]) and r["reward_errors"] == 0.0
