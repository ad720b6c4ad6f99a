"""Rollouts -> padded learner arrays.

Each row is  [left padding | prompt | completion | right padding]. Prompts
are left-padded to a common width W_p and completions right-padded to a fixed
width T_c (the rollout's max_tokens), so every step of a run has the same
shapes and the learner compiles once. Positions count real tokens from 0 in
each row, as the rollout engines do, so the learner's logprobs match the
sampler's position for position.

The completion-aligned arrays (mask, sampler logprobs, everything in a
`core.StepBatch`) are [N, T_c]; the learner's logprob of completion token j
sits at column W_p - 1 + j of `token_logprobs`' [N, W_p + T_c - 1] output.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from jaxrl_llm.rollout.types import RolloutBatch
from jaxrl_llm.train.learn.routing_replay import sequence_routing


class SequenceBatch(NamedTuple):
    tokens: np.ndarray  # int32 [N, W_p + T_c]
    attention_mask: np.ndarray  # int32 [N, W_p + T_c], 1 on prompt and completion tokens
    positions: np.ndarray  # int32 [N, W_p + T_c]
    completion_mask: np.ndarray  # float32 [N, T_c]: 1 on the policy's tokens (loss), 0 on padding/observations
    sampler_logp: np.ndarray  # float32 [N, T_c], 0 on padding
    truncated: np.ndarray  # bool [N]: finish_reason != "stop"
    prompt_width: int
    # int32 [N, W_p + T_c, nL, k]: the sampler's routing record of each token, in the tokens' columns,
    # -1 where none (train/learn/routing_replay.py); None: no record has routed_experts
    routing: np.ndarray | None = None


def build_sequences(rollouts: RolloutBatch, *, completion_width: int, pad_id: int = 0,
                    prompt_bucket: int = 16) -> SequenceBatch:
    """Pack a RolloutBatch into fixed-width learner arrays (see module docstring)."""
    records = rollouts.records
    longest_completion = max(r.num_completion_tokens for r in records)
    if longest_completion > completion_width:
        raise ValueError(f"a completion has {longest_completion} tokens, more than completion_width "
                         f"{completion_width}; set completion_width >= the rollout's max_tokens")
    longest_prompt = max(r.prompt_token_ids.size for r in records)
    prompt_width = max(prompt_bucket, int(math.ceil(longest_prompt / prompt_bucket)) * prompt_bucket)
    n, width = len(records), prompt_width + completion_width
    tokens = np.full((n, width), pad_id, np.int32)
    attention = np.zeros((n, width), np.int32)
    completion_mask = np.zeros((n, completion_width), np.float32)
    sampler_logp = np.zeros((n, completion_width), np.float32)
    for i, rec in enumerate(records):
        p, c = rec.prompt_token_ids.size, rec.num_completion_tokens
        tokens[i, prompt_width - p:prompt_width] = rec.prompt_token_ids
        tokens[i, prompt_width:prompt_width + c] = rec.completion_token_ids
        attention[i, prompt_width - p:prompt_width + c] = 1
        completion_mask[i, :c] = rec.policy_mask  # 0 on a multi-turn episode's observation tokens
        sampler_logp[i, :c] = rec.sampler_logprobs
    positions = np.maximum(np.cumsum(attention, axis=1) - 1, 0).astype(np.int32)
    truncated = np.array([r.finish_reason != "stop" for r in records])
    return SequenceBatch(tokens, attention, positions, completion_mask, sampler_logp, truncated, prompt_width,
                         sequence_routing(records, prompt_width, width))
