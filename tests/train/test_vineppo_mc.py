"""VinePPO's Monte-Carlo values through a real rollout engine (the JAX sampler, prefixes
as token-id prompts) against the closed-form continuation success probability: with
reward 1 when the first continuation token is even, V(prefix) = sum over even tokens of
pi(token | prefix), computed exactly from one forward pass."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.models import forward
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from tests.models.hf_reference import hf_model, our_config_and_params

K = 512
EOS = 95  # odd: an immediate stop scores 0, like an odd token
PREFIXES = [[5, 17, 3], [5, 17, 3, 10], [5, 17, 3, 10, 41], [9, 2, 44, 61, 8, 22]]


@pytest.mark.slow  # 32 s; make test keeps the in-loop closed form (test_vineppo_loop.py)
def test_mc_values_match_the_closed_form_continuation_success():
    cfg, params = our_config_and_params(hf_model("llama_tied", seed=5))
    even = np.arange(cfg.vocab_size) % 2 == 0
    exact = []
    for prefix in PREFIXES:
        logits, _ = forward(params, cfg, jnp.asarray([prefix]))
        exact.append(float(np.asarray(jax.nn.softmax(logits[0, -1].astype(jnp.float32)))[even].sum()))
    exact = np.array(exact)
    # one engine call for every prefix x K continuations
    rollouts = JaxSampler(cfg, params, eos_token_ids=[EOS]).generate(
        PREFIXES, n=K, params=SamplingParams(temperature=1.0, max_tokens=1, seed=0))
    rewards = np.array([float(r.completion_token_ids.size > 0 and r.completion_token_ids[0] % 2 == 0)
                        for r in rollouts.records]).reshape(len(PREFIXES), K)
    mean, stderr = map(np.asarray, core.mc_values(rewards))
    sigma = np.sqrt(exact * (1 - exact) / K)
    print(f"MC {np.round(mean, 3)} +- {np.round(stderr, 3)} vs closed form {np.round(exact, 3)}")
    assert np.all(np.abs(mean - exact) < 4 * sigma)
    np.testing.assert_allclose(stderr, sigma, rtol=0.2)  # the reported error is the sampling error
