"""Run-level: a tiny mixture-of-experts policy trained with RL on 1-digit addition raises its
held-out success (JAX sampler and learner, full fine-tuning, fp32).

The dense run-level test's setup (tests/launch/test_gpu_rl_tiny.py, `benchmarks.gpu.gpu_rl.rl_end_to_end`)
with a Qwen3-MoE instead of the dense decoder: hidden 64, 2 layers, 4 experts of width 64 per
layer, top-2 with renormalised gates (the two active experts are as wide as the dense MLP).
SFT from scratch on the 71 train questions (half of the targets "-8", a format error RL can
remove on the held-out questions too), then 10 dr_grpo steps of 8 x 8 at lr 3e-4, held-out
success on the 29 held-out questions x 16 samples before and after (same evaluation seed).

Margin: after >= before + MIN_GAIN and a one-sided two-proportion p < 0.05. Calibration run
(CPU, seed 0, load ~6): 0.119 -> 0.200 (p = 0.0007); MIN_GAIN = 0.04 is half of that gain, fixed
before the test's own runs. First test run: 0.136 -> 0.179 (one-sided p = 0.036; the SFT start
differs a little from run to run on a loaded CPU: loss 0.655 vs 0.620 after 180 steps), 885 s at
load ~9 (2 cores). Broken on purpose with lr 1e-9 (no learning): fails (see the report).
"""
import dataclasses
import json
import os

import pytest

from jaxrl_llm.benchmarks.common import addition_start
from jaxrl_llm.benchmarks.gpu import gpu_rl

MOE = dataclasses.replace(addition_start.E2E_TINY, num_experts=4, experts_per_token=2)
MIN_GAIN = 0.04


@pytest.mark.slow  # ~4-7 min on 2 cores (SFT 180 steps + 10 RL steps + 2 evaluations)
@pytest.mark.timeout(1200)
def test_rl_raises_heldout_success_of_a_tiny_moe_policy(tmp_path):
    out = gpu_rl.rl_end_to_end(str(tmp_path), tiny=True, setting=MOE)
    with open(os.path.join(out["sft"]["model_dir"], "config.json")) as f:
        hf = json.load(f)
    assert (hf["architectures"], hf["num_experts"], hf["num_experts_per_tok"]) == (["Qwen3MoeForCausalLM"], 4, 2)
    assert out["rl_steps"] == 10 and out["before"]["samples"] == out["after"]["samples"] == 29 * 16
    before, after = out["success_before"], out["success_after"]
    print(f"\nMoE held-out success {before:.3f} -> {after:.3f}, p one-sided {out['p_value_one_sided_increase']:.2g}, "
          f"RL {out['rl_wall_s']:.0f} s, total {out['total_wall_s']:.0f} s, load {os.getloadavg()}")
    assert 0.05 < before < 0.45  # the SFT start: low but not zero
    assert after >= before + MIN_GAIN
    assert out["p_value_one_sided_increase"] < 0.05


def test_lora_on_a_moe_policy_adapts_attention_only_and_refuses_mlp_targets():
    """The default targets (every projection) fit a MoE layer by dropping gate/up/down_proj, which it
    does not have (its experts stay frozen); naming them is refused, naming the valid targets."""
    import jax
    from types import SimpleNamespace

    from jaxrl_llm.models import init_params, lora
    from jaxrl_llm.models.config import tiny_decoder_config

    moe = tiny_decoder_config(vocab_size=64, family="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                              moe_intermediate_size=16)
    train = SimpleNamespace(lora_rank=2, lora_alpha=4.0, lora_targets=lora.LORA_TARGETS)
    spec = lora.spec_from_train_config(train, moe)
    assert spec.targets == ("q_proj", "k_proj", "v_proj", "o_proj")
    adapters = lora.init_adapters(init_params(moe, jax.random.key(0)), spec, jax.random.key(1))
    assert sorted(adapters["layers"]) == sorted(spec.targets)
    dense = tiny_decoder_config(vocab_size=64)
    assert lora.spec_from_train_config(train, dense).targets == lora.LORA_TARGETS  # dense: all seven
    named = SimpleNamespace(lora_rank=2, lora_alpha=4.0, lora_targets=("q_proj", "up_proj"))
    with pytest.raises(ValueError, match=r"names \['up_proj'\].*mixture of experts.*valid: \('q_proj'"):
        lora.spec_from_train_config(named, moe)
