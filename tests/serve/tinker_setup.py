"""Helpers of the Tinker server tests: the SDK's environment and independent reference numbers
(the tiny model loaded again with `train.policy.load_policy`, tied as saved, and scored with
`models.token_logprobs`)."""
from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

API_KEY = "tml-jaxrl-test-key"
WIDTH = 64  # longest token sequence the reference scores
TEXTS = ("the cat sat on the mat and looked around", "one two three four five")


def sdk_environment(url: str) -> dict[str, str]:
    return {"TINKER_API_KEY": API_KEY, "TINKER_BASE_URL": url, "TINKER_TELEMETRY": "0", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}


@functools.lru_cache(maxsize=2)
def reference_policy(model_dir: str):
    from jaxrl_llm.train.policy import load_policy

    return load_policy(model_dir)


def reference_logprobs(model_dir: str, tokens: list[int]) -> np.ndarray:
    """log pi(tokens[t+1] | tokens[:t+1]) [len - 1] of the base model, by models.token_logprobs."""
    from jaxrl_llm.models import token_logprobs

    policy = reference_policy(model_dir)
    padded = np.zeros((1, WIDTH), np.int32)  # right-padded to one width: one program for every call
    padded[0, :len(tokens)] = tokens
    return np.asarray(token_logprobs(policy.params, policy.cfg, jnp.asarray(padded)))[0, :len(tokens) - 1]


def reference_next_token_logprobs(model_dir: str, tokens: list[int]) -> np.ndarray:
    """log pi(v | tokens) [V] for every token v, from the base model's logits (models.forward)."""
    import jax

    policy = reference_policy(model_dir)
    padded = np.zeros((1, WIDTH), np.int32)
    padded[0, :len(tokens)] = tokens
    logits = _forward(policy.params, jnp.asarray(padded), cfg=policy.cfg)
    return np.asarray(jax.nn.log_softmax(logits[0, len(tokens) - 1]))


def _forward(params, tokens, *, cfg):
    import jax

    from jaxrl_llm.models import forward

    return jax.jit(lambda p, t: forward(p, cfg, t)[0])(params, tokens)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


def datum(ids: list[int], **inputs):
    """A Tinker Datum predicting ids[1:] from ids[:-1], with the loss's per-position inputs."""
    from tinker import types

    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], **inputs})


def rl_inputs(ids: list[int], seed: int) -> dict:
    """Random sampler log-probs (-4 to -3) and advantages (normal) for ids[1:]."""
    rng = np.random.default_rng(seed)
    n = len(ids) - 1
    return {"logprobs": (-3.0 - rng.random(n)).astype(np.float32).tolist(),
            "advantages": rng.normal(size=n).astype(np.float32).tolist()}
