"""ReMax's greedy rows and a GDPO run through the real vLLM CPU server (SmolLM2, float32).

Cheap (make test): a temperature-0 request returns transformers' greedy continuation, the same
for every seed, with logprobs equal to the JAX decoder's at temperature 1. Slow
(make test-all): 2-step `jaxrl train` runs of recipe.name=remax and recipe.name=gdpo on vLLM."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.rollout import DiskWeightSync, VLLMClient, VLLMEngine, bridge_export
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.metrics import read_metrics

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
    server = vllm_server.get()
    run_dir = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = str(REPO)
    cmd = [sys.executable, "-m", "jaxrl_llm.cli", "train", "--config", str(REPO / "experiments/demo.py"),
           "total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{server.url}]",
           "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "rollout.max_tokens=8",
           "train.micro_batch_size=8", "checkpoint.every_steps=0", "checkpoint.async_save=false",
           "metrics.tensorboard=false", f"run_dir={run_dir}", f"model.source={smollm2.hf_dir}", *extra]
    try:
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    finally:  # the shared server goes back to the base weights for the other tests
        sync = DiskWeightSync(VLLMClient([server.url]), bridge_export(smollm2.cfg))
        sync.push(smollm2.params, version=0)
        sync.close()
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2] and [r["weight_version"] for r in rows] == [0.0, 1.0]
    for r in rows:
        assert np.isfinite(r[metric]) and r["reward_errors"] == 0.0
