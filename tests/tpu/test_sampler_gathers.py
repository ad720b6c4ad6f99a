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


@pytest.mark.parametrize("data, tensor, kv_heads", [(2, 2, 2), (1, 4, 4)])
def test_sampler_layouts_gather_no_weight(devices, data, tensor, kv_heads):
    layout = SamplerLayout.plan(CFG, sampler_mesh(data, tensor, devices=devices))
    row = decode_step_report(CFG, SHAPE, None, layout)
    assert row["sampler_kv_heads"] == kv_heads  # tensor 4 > 2 KV heads: each stored twice
    assert row["weight_bytes_all_gathered_per_step"] == 0 and row["all_gather_bytes_per_step"] == 0
    assert row["collectives"]["all-reduce"]["count"] > 0  # the row-parallel o and down


def test_rollout_mesh_is_the_layout_jaxrl_compile_compiles(devices):
    """`step_programs` lays the sampler's programs and the hand-off out by rollout.mesh (unset: the learner's)."""
    mesh = make_mesh(fsdp=-1, devices=devices)
    cfg = apply_overrides(Config(), ["rollout.engine=jax", "rollout.mesh.tensor=4"])
    layout = sampler_layout(cfg.rollout.mesh, CFG, mesh)
    assert dict(layout.mesh.shape) == {"data": 1, "tensor": 4} and (layout.kv_repeat, layout.split_heads) == (2, True)
    assert list(layout.mesh.devices.flat) == list(mesh.devices.flat)
    assert sampler_layout(Config().rollout.mesh, CFG, mesh) is None
