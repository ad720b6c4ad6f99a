"""Batches sampled ahead of the learner, carried across a checkpoint.

With asynchronous rollouts (rollout.max_lag = m > 0) the batches of steps s+1..s+m are
sampled by weights older than those the checkpoint of step s holds, so a resumed run
cannot sample them again: the checkpoint's JSON metadata carries them (token ids, sampler
logprobs, finish reasons) and the resumed producer replays them. Versions are stored as
"versions behind the checkpoint's weights" so that they stay right whatever version the
resumed engine starts from. float32 logprobs survive JSON exactly (a float32 is a
float64, whose repr round-trips). A record's routed_experts (MoE routing replay) travel as
little-endian int16 in base64 with their shape: expert ids and -1 fit, and a list of ints per
(token, layer, slot) would be about three times larger.
"""
from __future__ import annotations

import base64
from typing import Any, Sequence

import numpy as np

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
                                      weight_version=version, loss_mask=r.get("loss_mask"),
                                      routed_experts=_routing_from_json(r.get("routed_experts")))
                        for r in item["records"])
        out[int(item["step"])] = SampledBatch(int(item["step"]), version,
                                              RolloutBatch(records, item["num_prompts"], item["samples_per_prompt"]))
    return out


def _record_json(r: RolloutRecord) -> dict[str, Any]:
    return {"prompt_index": r.prompt_index, "sample_index": r.sample_index,
            "prompt": r.prompt_token_ids.tolist(), "completion": r.completion_token_ids.tolist(),
            "logprobs": r.sampler_logprobs.tolist(), "finish_reason": r.finish_reason,
            **({} if r.loss_mask is None else {"loss_mask": r.loss_mask.tolist()}),
            **({} if r.routed_experts is None else {"routed_experts": _routing_json(r.routed_experts)})}


def _routing_json(experts: np.ndarray) -> dict[str, Any]:
    if experts.size and (experts.min() < -(2**15) or experts.max() >= 2**15):
        raise ValueError(f"routed_experts hold ids outside int16 ({experts.min()}..{experts.max()}); "
                         "the checkpoint's sampled-ahead batches store them as int16")
    return {"shape": list(experts.shape), "int16": base64.b64encode(experts.astype("<i2").tobytes()).decode("ascii")}


def _routing_from_json(item: dict[str, Any] | None) -> np.ndarray | None:
    if item is None:
        return None
    return np.frombuffer(base64.b64decode(item["int16"]), "<i2").reshape(item["shape"]).astype(np.int32)
