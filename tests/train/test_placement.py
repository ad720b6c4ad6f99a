"""`Placement`: where the learner's arrays sit, on one device and on a (data 2, fsdp 2, tensor 2) mesh of the
8 CPU devices (tests/conftest.py). The expected partition specs are read off `models.sharding`'s rule table
by hand (embed [V, D] -> ("tensor", "fsdp"); final_norm [D] -> replicated) and off the batch axes."""
from __future__ import annotations

import jax
import numpy as np
import optax
from jax.sharding import PartitionSpec as P

from jaxrl_llm.models import make_mesh
from jaxrl_llm.train.learn.packing import plan_rows
from jaxrl_llm.train.learn.placement import Placement

BATCH = ("data", "fsdp")


def _params():
    return {"embed": np.arange(32, dtype=np.float32).reshape(8, 4), "final_norm": np.ones(4, np.float32)}


def _plan():
    """Eight sequences (prompt width 2, completion width 2), one per row, four rows per micro-batch
    (`plan_rows`; four: the data-parallel devices): k = 2 micro-batches of R = 4 rows of W = 4 slots."""
    tokens = np.array([[0, 5, 6, 7], [8, 9, 10, 0], [0, 11, 12, 13], [14, 15, 16, 17]] * 2, np.int32)
    mask = (tokens > 0).astype(np.int32)
    return plan_rows(tokens, mask, 2, rows_per_micro=4, pack=False)


def test_on_a_mesh_moments_follow_their_params_and_counts_and_scalars_are_replicated():
    place = Placement(make_mesh(data=2, fsdp=2, tensor=2))
    assert place.data_parallel == 4
    optimizer = optax.adam(1e-3)
    params, opt_state, others = place.train_state(optimizer, _params(), (np.float32(2.0), np.int32(0)),
                                                  replicate_params=False)
    assert params["embed"].sharding.spec == P("tensor", "fsdp")
    assert params["final_norm"].sharding.spec == P(None)
    adam = opt_state[0]
    for moments in (adam.mu, adam.nu):
        assert moments["embed"].sharding.spec == P("tensor", "fsdp")
        assert moments["final_norm"].sharding.spec == P(None)
    assert adam.count.sharding.spec == P()
    assert all(x.sharding.spec == P() for x in others)
    np.testing.assert_array_equal(np.asarray(params["embed"]), _params()["embed"])  # placed, not changed
    # LoRA's adapters: every leaf replicated, the moments too
    params, opt_state, _ = place.train_state(optimizer, _params(), (), replicate_params=True)
    assert {x.sharding.spec for x in jax.tree.leaves((params, opt_state[0].mu))} == {P()}


def test_on_a_mesh_a_row_plan_splits_its_rows_and_replicates_its_read_back():
    place = Placement(make_mesh(data=2, fsdp=2, tensor=2))
    plan = _plan()
    assert plan.tokens.shape == (2, 4, 4)  # k x R x W
    rows = place.rows(plan)
    for name in ("tokens", "segment_ids", "positions"):  # [k, R, W]: the rows over the batch axes
        assert getattr(rows, name).sharding.spec == P(None, BATCH, None)
        np.testing.assert_array_equal(np.asarray(getattr(rows, name)), getattr(plan, name))
    for name in ("head_slots", "used", "completion_index", "micro_batch"):
        assert getattr(rows, name).sharding.spec == P()
    batch = place.batch({"mask": np.ones((4, 2), np.float32), "rewards": np.ones(4, np.float32)})
    assert batch["mask"].sharding.spec == P(BATCH, None)
    assert batch["rewards"].sharding.spec == P(BATCH)
    params = place.params(_params())
    assert params["embed"].sharding.spec == P("tensor", "fsdp")


def test_on_one_device_nothing_is_sharded():
    place = Placement(None)
    assert place.data_parallel == 1
    params = _params()
    assert place.params(params) is params
    optimizer = optax.adam(1e-3)
    placed, opt_state, others = place.train_state(optimizer, params, (1.0,), replicate_params=False)
    assert placed is params and others == (1.0,)
    np.testing.assert_array_equal(np.asarray(opt_state[0].mu["embed"]), np.zeros((8, 4), np.float32))
    rows = place.rows(_plan())
    assert isinstance(rows.tokens, jax.Array) and len(rows.tokens.sharding.device_set) == 1
    tree = (np.ones(3), np.zeros(2))
    assert place.host(tree) is tree  # every leaf already on this host: no gather
