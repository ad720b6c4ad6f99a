"""Batches sampled ahead of the learner, carried across a checkpoint.

With asynchronous rollouts (rollout.max_lag = m > 0) the batches of steps s+1..s+m are
sampled by weights older than those the checkpoint of step s holds, so a resumed run
cannot sample them again: the checkpoint's JSON metadata carries them (token ids, sampler
logprobs, finish reasons) and the resumed producer replays them. Versions are stored as
"versions behind the checkpoint's weights" so that they stay right whatever version the
resumed engine starts from. float32 logprobs survive JSON exactly (a float32 is a
float64, whose repr round-trips).
"""
from __future__ import annotations

from typing import Any, Sequence

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord
from jaxrl_llm.train.sample.async_rollout import SampledBatch

KEY = "sampled_ahead"


def to_metadata(batches: Sequence[SampledBatch], learner_version: int) -> dict[str, Any]:
    """{KEY: [...]} for a checkpoint written at `learner_version`."""
    return {KEY: [{"step": b.step, "behind": learner_version - b.weight_version,
                   "num_prompts": b.rollouts.num_prompts, "samples_per_prompt": b.rollouts.samples_per_prompt,
                   "records": [_record_json(r) for r in b.rollouts.records]} for b in batches]}


def from_metadata(metadata: dict[str, Any], learner_version: int) -> dict[int, SampledBatch]:
    """step -> SampledBatch from a checkpoint's metadata, relabelled for an engine now at
    `learner_version` (the checkpoint's weights)."""
    out = {}
    for item in (metadata or {}).get(KEY, []):
        version = learner_version - int(item["behind"])
        records = tuple(RolloutRecord(prompt_index=r["prompt_index"], sample_index=r["sample_index"],
                                      prompt_token_ids=r["prompt"], completion_token_ids=r["completion"],
                                      sampler_logprobs=r["logprobs"], finish_reason=r["finish_reason"],
                                      weight_version=version, loss_mask=r.get("loss_mask")) for r in item["records"])
        out[int(item["step"])] = SampledBatch(int(item["step"]), version,
                                              RolloutBatch(records, item["num_prompts"], item["samples_per_prompt"]))
    return out


def _record_json(r: RolloutRecord) -> dict[str, Any]:
    return {"prompt_index": r.prompt_index, "sample_index": r.sample_index,
            "prompt": r.prompt_token_ids.tolist(), "completion": r.completion_token_ids.tolist(),
            "logprobs": r.sampler_logprobs.tolist(), "finish_reason": r.finish_reason,
            **({} if r.loss_mask is None else {"loss_mask": r.loss_mask.tolist()})}
