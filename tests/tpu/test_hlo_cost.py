"""Loop-aware counting (benchmarks/tpu/hlo_cost.py) on programs compiled for a TPU slice, against
hand counts: FLOPs through (nested) loops, collectives of a hand-made shard_map program."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from jaxrl_llm.benchmarks.tpu.chips import parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.hlo_cost import program_cost, shape_bytes


@pytest.fixture(scope="module")
def mesh4():
    devices = slice_devices(parse_slice("v5e-4"))  # v5e:2x2; fails with the install hint without libtpu
    return jax.sharding.Mesh(np.asarray(devices).reshape(4), ("x",))


def _compile(fn, *args):
    return jax.jit(fn).lower(*args).compile()


def test_scanned_matmuls_count_every_iteration(mesh4):
    """x [B, D] through L layers of x @ w[l] in a scan, inside a scan over M micro-batches: the
    hand count is M * L * 2 * B * D * D per chip (rows split over 4 chips); XLA's own cost_analysis
    counts each loop body once."""
    micro, layers, rows, dim = 3, 5, 512, 256

    def model(xs, w):
        def layer(x, wl):
            return jnp.tanh(x @ wl), None

        def micro_batch(total, x):
            return total + jax.lax.scan(layer, x, w)[0].sum(), None

        return jax.lax.scan(micro_batch, jnp.zeros((), jnp.float32), xs)[0]

    xs = jax.ShapeDtypeStruct((micro, rows, dim), jnp.bfloat16, sharding=NamedSharding(mesh4, P(None, "x", None)))
    w = jax.ShapeDtypeStruct((layers, dim, dim), jnp.bfloat16, sharding=NamedSharding(mesh4, P()))
    compiled = _compile(model, xs, w)
    cost = program_cost(compiled.as_text())
    hand = micro * layers * 2 * (rows // 4) * dim * dim
    assert cost.flops == hand
    assert sorted(loop["trip_count"] for loop in cost.loops) == [micro, layers]
    assert cost.unknown_loops == []
    xla = compiled.cost_analysis()
    assert xla["flops"] < hand / 5  # the pitfall the loop-aware count removes: bodies counted once
    # the weights (replicated, 5 x 256 x 256 bf16) are read at least once per micro-batch's pass
    assert cost.hbm_bytes >= layers * dim * dim * 2


def test_decoder_scan_counts_as_unrolled(mesh4):
    """The real decoder's forward with its layers in a loop counts the matrix FLOPs of a hand count:
    every projection (2 x tokens x weights) and the attention's scores and values over all 32 keys,
    once per layer; and the same as the forward unrolled (no loop to multiply through). Weights and
    tokens replicated: each chip computes the whole forward."""
    from jaxrl_llm.models import param_shapes
    from jaxrl_llm.models.config import tiny_decoder_config
    from jaxrl_llm.models.decoder import Decoder

    cfg = tiny_decoder_config(num_layers=3, vocab_size=512).with_dtypes(param_dtype="bfloat16",
                                                                        compute_dtype="bfloat16")
    replicated = NamedSharding(mesh4, P())
    params = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=replicated), param_shapes(cfg))
    rows, length = 8, 32
    tokens = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=replicated)

    def run(unroll, p, t):
        positions = jnp.broadcast_to(jnp.arange(length), t.shape)
        visible = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (rows, length, length))
        return Decoder(cfg, unroll_layers=unroll).apply({"params": p}, t, positions, visible, return_hidden=True)[0]

    looped = program_cost(_compile(functools.partial(run, False), params, tokens).as_text())
    unrolled = program_cost(_compile(functools.partial(run, True), params, tokens).as_text())
    assert [loop["trip_count"] for loop in looped.loops] == [cfg.num_layers] and not unrolled.loops
    d, hd, f = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    weights = d * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * hd * d + 3 * d * f
    attention = 2 * (2 * rows * length * length * cfg.num_heads * hd)  # q k^T and p v
    hand = cfg.num_layers * (2 * rows * length * weights + attention)
    assert looped.flops == hand
    assert unrolled.flops == hand


def test_collectives_of_a_hand_made_program(mesh4):
    """shard_map with one psum of f32[1024] and one all_gather of bf16[256, 128] per chip: one
    all-reduce of 4096 bytes, one all-gather of 4 x 256 x 128 x 2 bytes, in a ring of 4 chips."""
    from jax import shard_map

    def body(a, b):
        return jax.lax.psum(a, "x"), jax.lax.all_gather(b, "x", axis=0, tiled=True)

    fn = shard_map(body, mesh=mesh4, in_specs=(P("x"), P("x", None)), out_specs=(P("x"), P(None, None)),
                   check_vma=False)
    a = jax.ShapeDtypeStruct((4 * 1024,), jnp.float32, sharding=NamedSharding(mesh4, P("x")))
    b = jax.ShapeDtypeStruct((4 * 256, 128), jnp.bfloat16, sharding=NamedSharding(mesh4, P("x", None)))
    cost = program_cost(_compile(fn, a, b).as_text())
    assert set(cost.collectives) == {"all-reduce", "all-gather"}
    assert cost.collectives["all-reduce"]["count"] == 1
    assert cost.collectives["all-reduce"]["bytes"] == 1024 * 4
    assert cost.collectives["all-reduce"]["ici_bytes"] == 1024 * 4 * 2 * 3 / 4
    assert cost.collectives["all-gather"]["count"] == 1
    assert cost.collectives["all-gather"]["bytes"] == 4 * 256 * 128 * 2
    assert cost.collectives["all-gather"]["ici_bytes"] == 4 * 256 * 128 * 2 * 3 / 4


def test_shape_bytes_reads_hlo_types():
    assert shape_bytes("bf16[128,256]{1,0:T(8,128)(2,1)}") == 128 * 256 * 2
    assert shape_bytes("(s32[], f32[4,8]{1,0}, pred[3])") == 4 + 128 + 3
    assert shape_bytes("bf16[128,256]{1,0:T(8,128)(2,1)S(1)}", hbm_only=True) == 0  # on-chip memory
