"""The small learner setup of the reference- and teacher-policy tests: a random tiny Llama
(tests/models/hf_reference.py), 4 prompts x 4 samples from the JAX sampler, random 0/1
rewards, and an independent full-logits forward to compare the learner's log-probs with."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import forward
from tests.models.hf_reference import hf_model, our_config_and_params

TEMPERATURE = 0.9
PROMPTS = [[5, 17, 3], [9, 2, 44, 61, 8], [70, 12], [33]]
G = 4
MAX_TOKENS = 6


def sampled_setup():
    """(model config, params, SequenceBatch of the sampled completions, rewards [prompts, G])."""
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams
    from jaxrl_llm.train.learn.batch import build_sequences

    cfg, params = our_config_and_params(hf_model("llama_tied", seed=5))
    rollouts = JaxSampler(cfg, params, eos_token_ids=[96]).generate(
        PROMPTS, n=G, params=SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, seed=3))
    seq = build_sequences(rollouts, completion_width=MAX_TOKENS, prompt_bucket=8)
    rewards = np.random.default_rng(0).integers(0, 2, size=(len(PROMPTS), G)).astype(np.float32)
    return cfg, params, seq, rewards


def separate_forward_logprobs(params, cfg, seq, dtype):
    """Completion log-probs from one full-logits forward of `params` cast to `dtype`
    (no micro-batches, no chunked LM head)."""
    cast = jax.tree.map(lambda x: jnp.asarray(x).astype(dtype), params)
    logits, _ = forward(cast, cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype), jnp.asarray(seq.tokens),
                        positions=jnp.asarray(seq.positions), attention_mask=jnp.asarray(seq.attention_mask))
    logp = jax.nn.log_softmax(logits.astype(jnp.float32) / TEMPERATURE, axis=-1)
    w, t = seq.prompt_width, MAX_TOKENS
    targets = jnp.asarray(seq.tokens[:, w:w + t])
    return np.asarray(jnp.take_along_axis(logp[:, w - 1:w - 1 + t], targets[..., None], axis=-1)[..., 0])
