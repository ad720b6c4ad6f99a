"""What every rollout engine takes and returns.

Both engines (the vLLM server client and the in-process JAX sampler) return
the same `RolloutBatch`, so the learner never knows which one produced it.

A record keeps the sampler's own token ids (no re-tokenisation) and the
sampler's log-probabilities mu of the sampled tokens, *after* temperature
(vLLM's `processed_logprobs`): those are the mu that the mismatch metrics and
corrections compare with the learner's recomputed pi_old
(docs/objectives.md#mismatch-corrections).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

FINISH_REASONS = ("stop", "length", "abort")


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """Sampling settings shared by every engine.

    Attributes:
      temperature: softmax temperature, > 0; or 0: greedy (the most likely
        token; its logprob is the one at temperature 1). Greedy rows are no RL
        samples: ReMax draws one per prompt as the baseline (train/sample/stage.py).
      top_p: nucleus mass in (0, 1]. RL rollouts should keep 1.0: with
        top_p < 1 the processed logprobs are renormalised over the nucleus,
        while the learner's pi_old is the full softmax
        (docs/objectives.md#sampler-support).
      top_k: keep the k most likely tokens; None means off.
      max_tokens: most completion tokens per sample, >= 1.
      stop_token_ids: generation stops after emitting any of these (the
        tokenizer's EOS is always a stop token unless the engine is told
        otherwise).
      seed: base seed for reproducible sampling; None means unseeded.
      ignore_eos: keep sampling past the engine's EOS tokens (vLLM's ignore_eos; the
        JAX sampler drops its eos_token_ids from the stop set), so every sample runs to
        max_tokens unless one of stop_token_ids ends it: fixed-length benchmark cells.
      first_row: index, in a larger batch, of this call's first sample (prompt
        p of the call, sample j is row first_row + p * n + j). Seeded noise is
        a function of (seed, row), so a batch split over several calls or
        processes draws the same samples as one call with first_row = 0.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    max_tokens: int = 256
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    first_row: int = 0

    def __post_init__(self):
        if not (np.isfinite(self.temperature) and self.temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {self.temperature!r}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 1):
            raise ValueError(f"top_k must be None (off) or an int >= 1, got {self.top_k!r}")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        stop = tuple(self.stop_token_ids)
        if any(not isinstance(t, (int, np.integer)) or t < 0 for t in stop):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in stop))
        if self.seed is not None and not isinstance(self.seed, (int, np.integer)):
            raise ValueError(f"seed must be None or an int, got {self.seed!r}")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if not isinstance(self.first_row, (int, np.integer)) or self.first_row < 0:
            raise ValueError(f"first_row must be an int >= 0, got {self.first_row!r}")


@dataclasses.dataclass(frozen=True, eq=False)
class RolloutRecord:
    """One sampled completion.

    Attributes:
      prompt_index: index of the prompt in the `generate` call (the group id).
      sample_index: 0..n-1 within that prompt's group.
      prompt_token_ids: int32 [P], exactly the ids sent to the engine.
      completion_token_ids: int32 [L], exactly the ids the engine sampled
        (including a final stop token when finish_reason == "stop").
      sampler_logprobs: float32 [L], log mu of each sampled token under the
        engine's processed distribution (after temperature).
      finish_reason: "stop" (a stop token or EOS), "length" (hit max_tokens
        or the context limit) or "abort".
      weight_version: version of the weights that produced the sample
        (0 = the weights the engine started with, +1 per update_weights).
      loss_mask: float32 [L] or None. None (every single-turn sample): all
        completion tokens are the policy's. A multi-turn episode
        (train/sample/episodes.py) sets 1 on the policy's tokens and 0 on the
        environment's observation tokens, which sit in the sequence but are
        no action of the policy (their sampler_logprobs are 0).
      routed_experts: int32 [P + L - 1, num_layers, top_k] or None (a dense model, or the
        engine was not asked). The experts each MoE layer of the sampler routed each token to,
        for routing replay (R3, Ma et al. 2025, arXiv 2510.11370): row t is the token at position
        t of prompt_token_ids + completion_token_ids (rows 0..P-1 the prompt, row P + i
        completion token i), experts in the router's top-k order. The last completion token
        has no row: the sampler never forwarded it, and the learner needs none for it (its
        logits predict nothing). So a learner forward over the P + L tokens replays rows
        0..P+L-2 at positions 0..P+L-2, exactly the positions whose outputs give the log-probs
        of completion tokens 0..L-1. -1 marks a dense layer of a mixed model.
    """

    prompt_index: int
    sample_index: int
    prompt_token_ids: np.ndarray
    completion_token_ids: np.ndarray
    sampler_logprobs: np.ndarray
    finish_reason: str
    weight_version: int
    loss_mask: np.ndarray | None = None
    routed_experts: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "prompt_token_ids", np.asarray(self.prompt_token_ids, np.int32))
        object.__setattr__(self, "completion_token_ids", np.asarray(self.completion_token_ids, np.int32))
        object.__setattr__(self, "sampler_logprobs", np.asarray(self.sampler_logprobs, np.float32))
        if self.completion_token_ids.ndim != 1 or self.prompt_token_ids.ndim != 1:
            raise ValueError("prompt_token_ids and completion_token_ids must be 1-D, got shapes "
                             f"{self.prompt_token_ids.shape} and {self.completion_token_ids.shape}")
        if self.sampler_logprobs.shape != self.completion_token_ids.shape:
            raise ValueError(f"sampler_logprobs shape {self.sampler_logprobs.shape} must match "
                             f"completion_token_ids shape {self.completion_token_ids.shape}")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"finish_reason must be one of {FINISH_REASONS}, got {self.finish_reason!r}")
        if self.loss_mask is not None:
            object.__setattr__(self, "loss_mask", np.asarray(self.loss_mask, np.float32))
            if self.loss_mask.shape != self.completion_token_ids.shape:
                raise ValueError(f"loss_mask shape {self.loss_mask.shape} must match completion_token_ids shape "
                                 f"{self.completion_token_ids.shape}")
        if self.routed_experts is not None:
            self._check_routed_experts()

    def _check_routed_experts(self) -> None:
        object.__setattr__(self, "routed_experts", np.asarray(self.routed_experts, np.int32))
        rows = len(self.prompt_token_ids) + len(self.completion_token_ids) - 1
        shape = self.routed_experts.shape
        if len(shape) != 3 or shape[0] != rows:
            raise ValueError(f"routed_experts must be [P + L - 1 = {rows}, num_layers, top_k] (one row per token "
                             f"the sampler forwarded), got shape {shape}")

    @property
    def policy_mask(self) -> np.ndarray:
        """float32 [L]: 1 on the policy's own tokens (all of them without a loss_mask)."""
        if self.loss_mask is None:
            return np.ones(self.completion_token_ids.shape, np.float32)
        return self.loss_mask

    @property
    def num_completion_tokens(self) -> int:
        return int(self.completion_token_ids.shape[0])


@dataclasses.dataclass(frozen=True, eq=False)
class RolloutBatch:
    """All samples of one `generate` call, ordered prompt-major:
    records[p * n + j] is sample j of prompt p."""

    records: tuple[RolloutRecord, ...]
    num_prompts: int
    samples_per_prompt: int

    def __post_init__(self):
        object.__setattr__(self, "records", tuple(self.records))
        want = self.num_prompts * self.samples_per_prompt
        if len(self.records) != want:
            raise ValueError(f"expected {self.num_prompts} prompts x {self.samples_per_prompt} samples "
                             f"= {want} records, got {len(self.records)}")
        for i, rec in enumerate(self.records):
            expected = divmod(i, self.samples_per_prompt)
            if (rec.prompt_index, rec.sample_index) != expected:
                raise ValueError(f"record {i} has (prompt_index, sample_index) = "
                                 f"{(rec.prompt_index, rec.sample_index)}, expected {expected}")

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    @property
    def group_ids(self) -> np.ndarray:
        """int32 [N]: the prompt index of each record (for group advantages)."""
        return np.asarray([r.prompt_index for r in self.records], np.int32)

    @property
    def weight_versions(self) -> np.ndarray:
        return np.asarray([r.weight_version for r in self.records], np.int64)

    def padded_completions(self, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Right-padded completion arrays of width max L_i.

        Returns (token_ids int32 [N, T], sampler_logprobs float32 [N, T],
        mask float32 [N, T]) with mask 1 on the policy's tokens, 0 on padding
        and on a multi-turn episode's observation tokens (the
        padded logprobs are 0 so sums over the mask need no where()).
        """
        width = max((r.num_completion_tokens for r in self.records), default=0)
        n = len(self.records)
        tokens = np.full((n, width), pad_id, np.int32)
        logprobs = np.zeros((n, width), np.float32)
        mask = np.zeros((n, width), np.float32)
        for i, rec in enumerate(self.records):
            length = rec.num_completion_tokens
            tokens[i, :length] = rec.completion_token_ids
            logprobs[i, :length] = rec.sampler_logprobs
            mask[i, :length] = rec.policy_mask
        return tokens, logprobs, mask


@runtime_checkable
class RolloutEngine(Protocol):
    """A rollout engine: samples completions and takes new weights.

    Implementations: `jaxrl_llm.rollout.vllm_engine.VLLMEngine` (HTTP to one
    or more vLLM servers) and the in-process JAX sampler.
    """

    @property
    def weight_version(self) -> int:
        """Version of the weights samples are drawn from now."""
        ...

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int,
                 params: SamplingParams) -> RolloutBatch:
        """Draw n samples for each prompt (given as token ids)."""
        ...

    def update_weights(self, params: Any) -> int:
        """Load new policy parameters (a learner params pytree); returns the
        new weight version. Samples drawn afterwards carry that version."""
        ...
