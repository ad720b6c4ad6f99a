"""Greedy decoding agrees across vLLM (CPU, float32), the JAX sampler and
transformers on real SmolLM2 weights; any divergence must sit at a near-tie
of the learner's own next-token distribution. Also the JAX sampler's float32
sampler/learner mismatch through core.mismatch_metrics. The learner scores all rows
of a batch in one padded forward pass (the `learner_logprobs` fixture)."""
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from tokenizers import Tokenizer

from jaxrl_llm import core
from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams

pytestmark = pytest.mark.vllm

QUESTIONS = ["What is 2 + 3? Answer with just the number.", "Name a colour of the sky.",
             "Write the word hello in French.", "What is the capital of Italy?"]
EOS = 2
MAX_TOKENS = 16
TIE_MARGIN = 1e-3  # |log p(a) - log p(b)| below this is a tie float32 rounding may break either way


@pytest.fixture(scope="module")
def prompts(smollm2):
    tokenizer = Tokenizer.from_file(str(Path(smollm2.hf_dir) / "tokenizer.json"))
    return [tokenizer.encode(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                             add_special_tokens=False).ids for q in QUESTIONS]


def transformers_greedy(hf_dir, prompts):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=MAX_TOKENS, eos_token_id=EOS,
                                 pad_token_id=EOS)[0, len(p):].tolist()
            out.append(ids)
    return out


def tie_margin(score, prefix, a, b) -> float:
    """|log pi(a | prefix) - log pi(b | prefix)| under the learner in float32 (both
    continuations scored in one forward pass)."""
    with_a, with_b = score([list(prefix) + [a], list(prefix) + [b]])
    return abs(float(with_a[-1]) - float(with_b[-1]))


def assert_agree_up_to_ties(score, prompt, x, y, names):
    x, y = list(x), list(y)
    for t in range(min(len(x), len(y))):
        if x[t] != y[t]:
            margin = tie_margin(score, prompt + x[:t], x[t], y[t])
            assert margin < TIE_MARGIN, f"{names} diverge at token {t} with margin {margin:.2e} (not a tie)"
            return
    assert len(x) == len(y) or EOS not in x + y or min(len(x), len(y)) == MAX_TOKENS, (names, x, y)


def test_greedy_decoding_agrees_across_vllm_jax_and_transformers(vllm_server, smollm2, prompts, learner_logprobs):
    greedy = SamplingParams(top_k=1, max_tokens=MAX_TOKENS, seed=0)
    server = vllm_server.get()
    from_vllm = [r.completion_token_ids.tolist()
                 for r in VLLMEngine(VLLMClient([server.url])).generate(prompts, 1, greedy)]
    from_jax = [r.completion_token_ids.tolist()
                for r in JaxSampler(smollm2.cfg, smollm2.params, eos_token_ids=[EOS]).generate(prompts, 1, greedy)]
    from_hf = transformers_greedy(smollm2.hf_dir, prompts)
    score = lambda sequences: learner_logprobs(smollm2.params, sequences)  # noqa: E731
    exact = 0
    for p, v, j, h in zip(prompts, from_vllm, from_jax, from_hf):
        assert_agree_up_to_ties(score, p, j, h, "jax/transformers")
        assert_agree_up_to_ties(score, p, v, h, "vllm/transformers")
        exact += v == j == h
    assert exact >= len(prompts) - 1  # at most one prompt may hit a near-tie
    assert all(len(x) > 0 for x in from_jax)


def test_jax_sampler_float32_mismatch_is_numerical_noise(smollm2, prompts, learner_logprobs):
    sampler = JaxSampler(smollm2.cfg, smollm2.params, eos_token_ids=[EOS])
    batch = sampler.generate(prompts, 2, SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=3))
    full = learner_logprobs(smollm2.params, [np.concatenate([r.prompt_token_ids, r.completion_token_ids])
                                             for r in batch])
    rows = [logp[len(r.prompt_token_ids) - 1:] for r, logp in zip(batch, full)]
    tokens, sampler_logp, mask = batch.padded_completions()
    learner = np.zeros(sampler_logp.shape, np.float32)
    for i, row in enumerate(rows):
        learner[i, :row.size] = row
    metrics = core.mismatch_metrics(jnp.asarray(learner), jnp.asarray(sampler_logp), jnp.asarray(mask))
    print({k: float(v) for k, v in metrics.items()})
    assert abs(float(metrics["mismatch_k1"])) < 1e-5
    assert float(metrics["mismatch_k3"]) < 1e-8
    assert float(metrics["mismatch_prob_pearson"]) > 0.99999
