"""The RL-like step batches the gpu-check learner rows run on: prompts of ~256 tokens and
long-tailed completions, drawn until a step's token target is reached (`rl_length_mix`), and the
model FLOPs of one learner update on them (`learner_flops`; the count is stated in
`benchmarks.gpu.gpu_check`'s docstring)."""
from __future__ import annotations

import dataclasses

import numpy as np

from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.train.learn.batch import SequenceBatch

GROUP = 8  # samples per prompt in the synthetic step batches


@dataclasses.dataclass(frozen=True)
class LengthMix:
    """An RL-like step: prompts of ~256 tokens, long-tailed completions (log-normal, capped)."""

    prompt_low: int = 200
    prompt_high: int = 312
    prompt_width: int = 320
    completion_median: float = 400.0
    completion_sigma: float = 0.9
    completion_width: int = 1728  # rows of 320 + 1728 = 2048 slots


TINY_MIX = LengthMix(prompt_low=3, prompt_high=8, prompt_width=8, completion_median=6.0, completion_sigma=0.6,
                     completion_width=24)


def rl_length_mix(target_tokens: int, mix: LengthMix, vocab: int, seed: int = 0) -> tuple[SequenceBatch, np.ndarray]:
    """Sequences drawn until their tokens reach `target_tokens` (a multiple of GROUP sequences),
    laid out as `train.batch.build_sequences` does; and random 0/1 rewards [N / GROUP, GROUP]."""
    rng = np.random.default_rng(seed)
    prompts, completions = [], []
    while sum(prompts) + sum(completions) < target_tokens or len(prompts) % GROUP:
        prompts.append(int(rng.integers(mix.prompt_low, mix.prompt_high + 1)))
        completions.append(int(np.clip(rng.lognormal(np.log(mix.completion_median), mix.completion_sigma), 4,
                                        mix.completion_width)))
    n, width = len(prompts), mix.prompt_width + mix.completion_width
    tokens = np.zeros((n, width), np.int32)
    attention = np.zeros((n, width), np.int32)
    completion = np.zeros((n, mix.completion_width), np.float32)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        start = mix.prompt_width - p
        tokens[i, start:mix.prompt_width + c] = rng.integers(1, vocab, p + c)
        attention[i, start:mix.prompt_width + c] = 1
        completion[i, :c] = 1
    positions = np.maximum(np.cumsum(attention, 1) - 1, 0).astype(np.int32)
    seq = SequenceBatch(tokens, attention, positions, completion, -2.0 * completion, np.zeros(n, bool),
                        mix.prompt_width)
    rewards = rng.integers(0, 2, (n // GROUP, GROUP)).astype(np.float32)
    return seq, rewards


def body_params(cfg: DecoderConfig, experts: int | None = None) -> int:
    """Matmul weights of the layers one token passes through: q, k, v, o and the MLP; a mixture of
    experts' MLP is its router and `experts` experts' gate / up / down (default: the k it routes to,
    the active parameters; E: what the dense form `models.moe.experts_swiglu` computes, every expert on every token)."""
    d, hd = cfg.hidden_size, cfg.head_dim
    attention = d * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * hd * d
    if cfg.is_moe:
        experts = cfg.num_experts_per_tok if experts is None else experts
        mlp = d * cfg.num_experts + 3 * d * cfg.moe_intermediate_size * experts
    else:
        mlp = 3 * d * cfg.intermediate_size
    return cfg.num_layers * (attention + mlp)


def learner_flops(cfg: DecoderConfig, seq: SequenceBatch) -> dict[str, float]:
    """The module docstring's FLOP count of one update on `seq`, and its parts. A mixture of experts
    counts its active parameters (router + k experts); ``dense_work_flops`` is the same count with
    all E experts, the work the dense expert form really does (E / k times the experts')."""
    lengths = seq.attention_mask.sum(1).astype(np.float64)
    completion = float(seq.completion_mask.sum())
    tokens = float(lengths.sum())
    attention = 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * float((lengths * (lengths + 1) / 2).sum())
    head = 6.0 * cfg.hidden_size * cfg.vocab_size * completion
    body = float(body_params(cfg))
    out = {"flops": 6.0 * body * tokens + head + attention, "tokens": tokens, "completion_tokens": completion,
           "body_params": body, "attention_flops": attention}
    if cfg.is_moe:
        out["dense_work_flops"] = 6.0 * body_params(cfg, cfg.num_experts) * tokens + head + attention
    return out
