"""Checks every rollout batch must pass, whichever engine produced it."""
from __future__ import annotations

from typing import Iterable

import numpy as np

from jaxrl_llm.rollout import RolloutBatch, RolloutRecord

EOS = 2  # <|im_end|>, SmolLM2's eos_token_id


def assert_complete_batch(batch: RolloutBatch, prompts: list[list[int]], n: int, max_tokens: int) -> None:
    """Every (prompt, sample) came back, in order, with the prompt ids sent,
    1..max_tokens completion ids, one finite logprob <= 0 per id, and a finish
    reason that matches the ids (stop: ends in EOS; length: exactly max_tokens)."""
    assert (batch.num_prompts, batch.samples_per_prompt, len(batch)) == (len(prompts), n, len(prompts) * n)
    for row, record in enumerate(batch):
        assert (record.prompt_index, record.sample_index) == divmod(row, n)
        np.testing.assert_array_equal(record.prompt_token_ids, prompts[record.prompt_index])
        ids, logprobs = record.completion_token_ids, record.sampler_logprobs
        assert ids.dtype == np.int32 and logprobs.dtype == np.float32 and ids.shape == logprobs.shape
        assert 1 <= ids.size <= max_tokens
        assert np.isfinite(logprobs).all() and (logprobs <= 0).all()
        if record.finish_reason == "stop":
            assert ids[-1] == EOS and EOS not in ids[:-1]
        else:
            assert record.finish_reason == "length" and ids.size == max_tokens and EOS not in ids


def completion_ids(records: Iterable[RolloutRecord]) -> list[list[int]]:
    return [record.completion_token_ids.tolist() for record in records]


def assert_same_samples(first: Iterable[RolloutRecord], second: Iterable[RolloutRecord],
                        logprob_atol: float = 1e-6) -> None:
    """The same token ids everywhere, and logprobs equal up to logprob_atol
    (a RolloutBatch is an iterable of records, so is a slice of its records)."""
    first, second = list(first), list(second)
    assert len(first) == len(second)
    assert completion_ids(first) == completion_ids(second)
    for a, b in zip(first, second):
        np.testing.assert_allclose(a.sampler_logprobs, b.sampler_logprobs, rtol=0, atol=logprob_atol)
