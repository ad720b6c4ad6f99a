"""The MoE block's experts compiled for a TPU chip (v5e): the forward of the ragged form (and of "auto",
which must take it for a TPU) follows the active experts, the dense form all E of them (E / k times)."""
from __future__ import annotations

import dataclasses

import pytest

from jaxrl_llm.benchmarks.tpu.chips import parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.moe_flops import block_flops, compile_block, xla_flops
from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.models.sharding import make_mesh

# D 256, E 16 experts of width 128, top-2: E / k = 8; 256 tokens
CFG = DecoderConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_layers=1, num_heads=4, num_kv_heads=2,
                    head_dim=64, family="qwen3_moe", num_experts=16, num_experts_per_tok=2, moe_intermediate_size=128,
                    norm_topk_prob=True, compute_dtype="bfloat16")
TOKENS = 256


@pytest.fixture(scope="module")
def chip():
    return make_mesh(1, 1, 1, devices=slice_devices(parse_slice("v5e-4"))[:1])


# XLA's cost model counts TPU's ragged-dot (Mosaic) kernels at 0.86-1.02 of the hand count (measured on
# this block's parts), hence the lower bound 0.8. Forward + backward: the ragged form's weight gradient
# is computed over all E groups (about (1 + 1 + E) / 3 = 6 times here); "auto" takes the dense form's
# gradient (about E / k = 8 times); the forward of both follows the active experts.
@pytest.mark.parametrize("form, grad, low, high", [
    ("ragged", False, 0.8, 1.3), ("auto", False, 0.8, 1.3), ("dense", False, 7.0, 8.5),
    ("ragged", True, 5.0, 6.5), ("auto", True, 5.5, 8.5), ("dense", True, 7.0, 8.5)])
def test_block_flops_follow_the_form_on_tpu(chip, form, grad, low, high):
    """Active FLOPs of the block's forward + backward by hand: 3 (2 T D E + 2 T k 3 D F) = 308281344,
    its forward a third of that; the dense form computes all E = 16 experts for every token."""
    assert block_flops(CFG, TOKENS) == 3 * (2 * 256 * 256 * 16 + 2 * 256 * 2 * 3 * 256 * 128) == 308281344
    compiled = compile_block(dataclasses.replace(CFG, moe_experts=form), form, chip, TOKENS, grad=grad)
    ratio = xla_flops(compiled) / (block_flops(CFG, TOKENS) / (1 if grad else 3))
    assert low <= ratio <= high, ratio
