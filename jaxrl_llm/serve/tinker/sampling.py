"""Tinker's sample call on the project's JAX sampler (`rollout.JaxSampler`).

SamplingParams map one to one: temperature, top_p, top_k (-1: off), seed, max_tokens (None: up
to the context length). `stop`: None stops at the tokenizer's EOS; a list of token ids stops
after any of them (and EOS); [] disables every stop, EOS included; strings: the completion ends
with the first token at which the decoded text contains one of them (the sampler runs to
max_tokens or EOS, the rest is cut; the stop string's tokens stay in the completion, as
Tinker returns them). Prompt log-probs come from `models.token_logprobs`, NaN at position 0.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import DecoderConfig, token_logprobs
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import SamplingParams
from jaxrl_llm.serve.tinker.wire import Sequence as SampledSequence

MAX_SAMPLES = 256
PROMPT_BUCKET = 32


@dataclasses.dataclass(frozen=True)
class SampleCall:
    prompt: np.ndarray  # int32 [P]
    num_samples: int
    params: dict  # Tinker SamplingParams as JSON
    prompt_logprobs: bool


def _stop_sets(stop: Any) -> tuple[tuple[int, ...], tuple[str, ...], bool]:
    """(stop token ids, stop strings, ignore_eos) of Tinker's `stop`."""
    if stop is None:
        return (), (), False
    items = [stop] if isinstance(stop, str) else list(stop)
    if not items:
        return (), (), True
    if all(isinstance(s, str) for s in items):
        return (), tuple(items), False
    if all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in items):
        return tuple(items), (), False
    raise ValueError(f"sampling_params.stop={stop!r}; valid: None, a string, a list of strings or of token ids >= 0")


def sampling_params(call: SampleCall, context: int) -> tuple[SamplingParams, tuple[str, ...]]:
    p = call.params
    room = context - call.prompt.size
    if room < 1:
        raise ValueError(f"prompt of {call.prompt.size} tokens leaves no room in the model's context of {context}")
    max_tokens = p.get("max_tokens")
    max_tokens = room if max_tokens is None else int(max_tokens)
    if not 1 <= max_tokens <= room:
        raise ValueError(f"sampling_params.max_tokens={max_tokens}; valid: 1 to {room} for this prompt")
    top_k = int(p.get("top_k", -1))
    stop_ids, stop_strings, ignore_eos = _stop_sets(p.get("stop"))
    params = SamplingParams(temperature=float(p.get("temperature", 1.0)), top_p=float(p.get("top_p", 1.0)),
                            top_k=None if top_k in (-1, 0) else top_k, max_tokens=max_tokens,
                            stop_token_ids=stop_ids, seed=p.get("seed"), ignore_eos=ignore_eos)
    return params, stop_strings


def cut_at_stop(tokens: np.ndarray, decode, stops: Sequence[str]) -> int | None:
    """Tokens kept: up to and including the first token whose decoded prefix holds a stop string."""
    for end in range(1, tokens.size + 1):
        text = decode(tokens[:end].tolist())
        if any(s in text for s in stops):
            return end
    return None


def check_call(call: SampleCall, vocab_size: int) -> None:
    if call.prompt.size == 0:
        raise ValueError("sample with an empty prompt; valid: at least one token")
    if call.prompt.min() < 0 or call.prompt.max() >= vocab_size:
        raise ValueError(f"prompt holds token ids outside 0 to {vocab_size - 1}")
    if not 1 <= call.num_samples <= MAX_SAMPLES:
        raise ValueError(f"num_samples={call.num_samples}; valid: 1 to {MAX_SAMPLES}")


def prompt_logprobs(params: dict, cfg: DecoderConfig, prompt: np.ndarray) -> np.ndarray:
    """float32 [P]: NaN, then log pi(prompt[t] | prompt[:t]) for t >= 1 (the prompt right-padded to a
    multiple of PROMPT_BUCKET, so few programs are compiled; causal attention keeps the padding out)."""
    if prompt.size < 2:
        return np.full(prompt.size, np.nan, np.float32)
    padded = np.zeros((1, -(-prompt.size // PROMPT_BUCKET) * PROMPT_BUCKET), np.int32)
    padded[0, :prompt.size] = prompt
    logp = np.asarray(token_logprobs(params, cfg, jnp.asarray(padded)))[0, :prompt.size - 1]
    return np.concatenate([[np.nan], logp]).astype(np.float32)


def sample(sampler: JaxSampler, params: dict, cfg: DecoderConfig, decode, call: SampleCall
           ) -> tuple[list[SampledSequence], np.ndarray | None]:
    """The call's completions (with their sampler log-probs) and, if asked, the prompt's log-probs."""
    check_call(call, cfg.vocab_size)
    settings, stops = sampling_params(call, cfg.max_position_embeddings)
    sampler.update_weights(params)
    batch = sampler.generate([call.prompt], call.num_samples, settings)
    sequences = []
    for record in batch.records:
        tokens, logprobs, reason = record.completion_token_ids, record.sampler_logprobs, record.finish_reason
        end = cut_at_stop(tokens, decode, stops) if stops else None
        if end is not None:
            tokens, logprobs, reason = tokens[:end], logprobs[:end], "stop"
        sequences.append(SampledSequence(tokens, logprobs, reason))
    return sequences, (prompt_logprobs(params, cfg, call.prompt) if call.prompt_logprobs else None)
