"""RolloutRecord.routed_experts survive every place the step's records are rebuilt on their way
to the learner: the multi-process gather (`train.distributed.allgather_rollouts`, run here in
one process: the same packing into fixed-width arrays and back) and the sampled-ahead batches a
checkpoint carries (`train.run.sampled_ahead`, through JSON). Multi-turn episodes:
tests/train/test_episodes.py."""
import json

import numpy as np

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord
from jaxrl_llm.train.distributed import allgather_rollouts
from jaxrl_llm.train.run import sampled_ahead
from jaxrl_llm.train.sample.async_rollout import SampledBatch


def _records(with_routing=(True, True, False, True)):
    rng = np.random.default_rng(0)
    out = []
    for i, routed in enumerate(with_routing):
        p, c = 2 + i, 3 - i % 2
        experts = rng.integers(-1, 60, size=(p + c - 1, 3, 2)).astype(np.int32) if routed else None
        out.append(RolloutRecord(i // 2, i % 2, rng.integers(0, 50, p), rng.integers(0, 50, c),
                                 rng.normal(size=c).astype(np.float32), "stop", 0, routed_experts=experts))
    return RolloutBatch(tuple(out), 2, 2)


def _assert_same_routing(got, want):
    for a, b in zip(got.records, want.records):
        np.testing.assert_array_equal(a.completion_token_ids, b.completion_token_ids)
        if b.routed_experts is None:
            assert a.routed_experts is None
        else:
            assert a.routed_experts.dtype == np.int32
            np.testing.assert_array_equal(a.routed_experts, b.routed_experts)


def test_the_gather_carries_routed_experts():
    rollouts = _records()
    gathered, rewards, counts = allgather_rollouts(rollouts, np.zeros((2, 2)), np.array([0, 0]), prompt_width=8,
                                                   completion_width=4)
    _assert_same_routing(gathered, rollouts)
    dense = _records((False,) * 4)
    assert all(r.routed_experts is None for r in allgather_rollouts(
        dense, np.zeros((2, 2)), np.array([0, 0]), prompt_width=8, completion_width=4)[0].records)


def test_sampled_ahead_batches_carry_routed_experts_through_json():
    rollouts = _records()
    metadata = json.loads(json.dumps(sampled_ahead.to_metadata([SampledBatch(5, 2, rollouts)], learner_version=3)))
    restored = sampled_ahead.from_metadata(metadata, learner_version=3)[5].rollouts
    _assert_same_routing(restored, rollouts)
