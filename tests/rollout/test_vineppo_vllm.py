"""VinePPO's continuation requests against the real vLLM CPU server (SmolLM2, float32):
token-id prefixes of real responses, K continuations each, all in one engine call.

Closed form: the grader scores a completion 1 when the code point of its first character
is even. The response's first token decides that, so every prefix holding >= 1 response
token has V exactly 0 or 1 (its response's own score), and V(prompt) = the probability
mass of the tokens whose text starts with an even code point, from one JAX forward pass
of SmolLM2 on the prompt."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm.data import TRAIN, ChatTemplate, make_task
from jaxrl_llm.models import forward
from jaxrl_llm.rollout import VLLMClient, VLLMEngine
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.train.sample import vineppo_step

pytestmark = [pytest.mark.vllm, pytest.mark.slow]  # ~1 min beside the shared server's start
K = 48
MAX_TOKENS = 4


def even_first_char(text: str) -> float:
    return float(bool(text) and ord(text[0]) % 2 == 0)


def test_vineppo_continuations_through_the_vllm_server(vllm_server, smollm2):
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{smollm2.hf_dir}/tokenizer.json")
    chat = ChatTemplate.from_hf_dir(smollm2.hf_dir)
    eos = tokenizer.token_to_id(chat.special_tokens["eos_token"])
    examples = make_task("addition", digits=1).examples(TRAIN, 2, seed=0)
    prompts = [tokenizer.encode(chat.render_prompt(e.prompt), add_special_tokens=False).ids for e in examples]
    engine = VLLMEngine(VLLMClient([vllm_server.get().url]))
    params = SamplingParams(temperature=1.0, max_tokens=MAX_TOKENS, seed=7)
    rollouts = engine.generate(prompts, 4, params)
    decode = lambda ids: tokenizer.decode([t for t in ids if t != eos])  # noqa: E731
    rewards = np.array([even_first_char(decode(r.completion_token_ids.tolist())) for r in rollouts.records])
    calls = []
    real = engine.generate

    def counted(prefixes, n, params):
        calls.append((len(prefixes), n, params))
        return real(prefixes, n, params)

    engine.generate = counted
    est = vineppo_step.estimate(engine, rollouts, rewards.reshape(2, 4), examples, k=K,
                                rule=vineppo_step.ChunkRule(every=2), params=params, decode=decode,
                                grade=lambda texts, _: np.array([even_first_char(t) for t in texts]))
    assert len(calls) == 1 and calls[0][0] == est.metrics["vineppo_prefixes"] and calls[0][1] == K
    assert calls[0][2].temperature == 1.0 and calls[0][2].max_tokens == MAX_TOKENS
    later = est.starts.copy()
    later[:, 0] = False
    assert later.sum() > 0
    np.testing.assert_array_equal(est.start_values[later], np.broadcast_to(rewards[:, None], later.shape)[later])
    np.testing.assert_allclose((est.advantages * est.starts).sum(axis=1), rewards - est.start_values[:, 0], atol=1e-6)
    texts = tokenizer.decode_batch([[i] for i in range(smollm2.cfg.vocab_size)])
    even = np.array([even_first_char(t) for t in texts], bool)
    for p, ids in enumerate(prompts):
        logits, _ = forward(smollm2.params, smollm2.cfg, jnp.asarray([ids]))
        exact = float(np.asarray(jax.nn.softmax(logits[0, -1].astype(jnp.float32)))[even].sum())
        value = est.start_values[p * 4, 0]
        sigma = max(np.sqrt(exact * (1 - exact) / K), 0.01)
        print(f"prompt {p}: V MC {value:.3f} vs closed form {exact:.3f} (sigma {sigma:.3f})")
        assert abs(value - exact) < 4 * sigma
