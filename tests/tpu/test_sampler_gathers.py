"""Weights all-gathered per slot-decode step, from the HLO of a deviceless v5e-4 (v5e:2x2) compile of a
tiny Qwen2-like decoder: in the learner's FSDP layout, every matrix whose contraction dimension is split
(q, k, v, gate, up in each layer; the tied embedding as LM head) by hand; in the sampler's own layouts
(`rollout.sampler_mesh`), none."""
from __future__ import annotations

import pytest

from jaxrl_llm.benchmarks.tpu.chips import parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.programs import StepShape, sampler_layout
from jaxrl_llm.benchmarks.tpu.sampler_gathers import decode_step_report
from jaxrl_llm.models import make_mesh
from jaxrl_llm.models.config import tiny_decoder_config
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout, sampler_mesh
from jaxrl_llm.train.config import Config, apply_overrides

CFG = tiny_decoder_config(family="qwen2", qkv_bias=True, vocab_size=1024, hidden_size=256, intermediate_size=512,
                          num_heads=4, num_kv_heads=2, head_dim=64,
                          max_position_embeddings=256).with_dtypes("bfloat16", "bfloat16")
SHAPE = StepShape(prompts=4, samples=4, prompt_len=16, new_tokens=16)  # 16 slots


@pytest.fixture(scope="module")
def devices():
    return slice_devices(parse_slice("v5e-4"))


def test_learner_layout_gathers_the_split_contractions(devices):
    row = decode_step_report(CFG, SHAPE, make_mesh(fsdp=-1, devices=devices), None)
    c = CFG  # bf16: 2 bytes; per layer q, k, v, gate, up [D, out]; o and down gather their outputs instead
    hand = 2 * (c.num_layers * c.hidden_size * (c.q_dim + 2 * c.kv_dim + 2 * c.intermediate_size)
                + c.vocab_size * c.hidden_size)
    assert row["weight_bytes_all_gathered_per_step"] == hand == 2097152
    assert row["weight_all_gathers_per_step"] == 5 * c.num_layers + 1


def test_sampler_layouts_gather_no_weight(devices):
    """data 2 x tensor 2: heads split with their KV heads. tensor 4 > 2 KV heads: the heads plan stores each
    KV head twice (the compacting decode's); the slot decode's splits the cache by slots and reads it once,
    gathering only activations (q/k/v of the step's rows). Per step, over the 4 chips, the heads plan reads
    at least the second copy of the cache more than the slots plan, and the slots plan reads at most 1.25 x
    the bf16 weights and the cache (the issue's goal for the decode bytes ratio)."""
    rows = {}
    for data, tensor, decode in [(2, 2, "slots"), (1, 4, "compact"), (1, 4, "slots")]:
        layout = SamplerLayout.plan(CFG, sampler_mesh(data, tensor, devices=devices), decode)
        rows[data, tensor, decode] = row = decode_step_report(CFG, SHAPE, None, layout)
        assert row["weight_bytes_all_gathered_per_step"] == 0
        assert row["collectives"]["all-reduce"]["count"] > 0  # the row-parallel o and down
    assert [r["sampler_kv_heads"] for r in rows.values()] == [2, 4, 2]
    assert rows[2, 2, "slots"]["all_gather_bytes_per_step"] == rows[1, 4, "compact"]["all_gather_bytes_per_step"] == 0
    slots = rows[1, 4, "slots"]
    # activations only: at most the step's q, k, v and attention output of 16 rows per layer, bf16 (a weight
    # matrix alone is 256 x 256 x 2 bytes)
    q, kv_new = 16 * CFG.q_dim * 2, 2 * 16 * CFG.kv_dim * 2
    assert 0 < slots["all_gather_bytes_per_step"] <= CFG.num_layers * (2 * q + kv_new)
    cache = 2 * CFG.num_layers * SHAPE.sequences * 32 * CFG.num_kv_heads * CFG.head_dim * 2  # k, v: 32 slots, bf16
    weights = 2 * CFG.num_params()
    heads_total, slots_total = (4 * rows[1, 4, d]["hbm_bytes_accessed_per_step"] for d in ("compact", "slots"))
    assert heads_total - slots_total >= cache and slots_total <= 1.25 * (weights + cache)


def test_rollout_mesh_is_the_layout_jaxrl_compile_compiles(devices):
    """`step_programs` lays the sampler's programs and the hand-off out by rollout.mesh (unset: the learner's)."""
    mesh = make_mesh(fsdp=-1, devices=devices)
    cfg = apply_overrides(Config(), ["rollout.engine=jax", "rollout.mesh.tensor=4"])
    layout = sampler_layout(cfg.rollout.mesh, CFG, mesh, decode="compact")
    assert dict(layout.mesh.shape) == {"data": 1, "tensor": 4} and (layout.kv_repeat, layout.split_heads) == (2, True)
    assert list(layout.mesh.devices.flat) == list(mesh.devices.flat)
    assert sampler_layout(cfg.rollout.mesh, CFG, mesh, decode="slots").split_slots
    assert sampler_layout(Config().rollout.mesh, CFG, mesh, decode="slots") is None
