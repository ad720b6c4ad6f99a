"""`make bench-lora`, `bench-objectives`, `bench-sampler-paired`, `bench-moe-experts` and `bench-tinker-batching` at their --tiny sizes: parameter,
optimiser and reference bytes counted by hand from the tiny shapes, the ratios against their
own baselines, the same sampler program paired with itself drawing the same tokens, and the MoE
block's compiled FLOPs per expert form against counts by hand, the Tinker clients' losses batched, alone
and on merged params agreeing."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from jaxrl_llm.benchmarks.cpu import lora, moe_experts, objectives, sampler_paired, tinker_batching

# learner_gpu's "tiny" shape: vocab 512, hidden 64, MLP 128, 2 layers, 4 heads + 2 KV heads of 16,
# q/k/v biases, tied head. Per layer: q, k+v, o, MLP, 2 norms.
TINY_LAYER = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
TINY_PARAMS = 512 * 64 + 2 * TINY_LAYER + 64
# fan_in + fan_out of the seven adapted projections of one layer: q, k, v, o, gate, up, down
LORA_PER_RANK_LAYER = (64 + 64) + 2 * (64 + 32) + (64 + 64) + 3 * (64 + 128)


@pytest.mark.slow  # 21 s; make test-all since 2026-11-29 (make test time)
def test_lora_tiny_counts_state_bytes_by_hand():
    out = lora.main(["--tiny"])
    assert list(out) == ["full", "lora r=4"]
    full = out["full"]
    assert full["trainable_values"] == TINY_PARAMS == 107072
    assert full["param_bytes"] == 4 * TINY_PARAMS and full["opt_bytes"] == 2 * 4 * TINY_PARAMS  # AdamW: 2 moments
    row, adapters = out["lora r=4"], 2 * 4 * LORA_PER_RANK_LAYER
    assert row["trainable_values"] == adapters
    assert row["param_bytes"] == 4 * (TINY_PARAMS + adapters)  # frozen float32 base + adapters
    assert row["opt_bytes"] == 2 * 4 * adapters
    assert row["s_per_step"] > 0 and row["vs_full"] == pytest.approx(row["s_per_step"] / full["s_per_step"])
    assert full["vs_full"] == 1.0


# The KL term keeps a float32 copy of the weights: objectives' tiny policy is a random 2-layer decoder
# of hidden 64 (MLP 128, 4 heads + 2 KV heads of 16, no biases, tied head) over SmolLM2's 49152 tokens.
OBJECTIVES_LAYER = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128 + 2 * 64
OBJECTIVES_PARAMS = 49152 * 64 + 2 * OBJECTIVES_LAYER + 64


def check_against_grpo(out: dict) -> None:
    tokens = 4 * (8 + 8)
    for row in out.values():
        assert row["tokens_per_s"] == pytest.approx(tokens / row["s_per_step"])
        assert row["vs_grpo"] == pytest.approx(out["grpo"]["s_per_step"] / row["s_per_step"])
    assert out["grpo"]["vs_grpo"] == 1.0 and out["grpo"]["reference_bytes"] == 0


@pytest.mark.slow  # 19 s; make test-all since 2026-11-29 (make test time)
def test_objectives_tiny_kl_term_costs_one_float32_copy_of_the_weights():
    out = objectives.main(["--tiny", "--only", "grpo_kl"])
    assert set(out) == {"grpo", "grpo_kl"}
    check_against_grpo(out)
    assert out["grpo_kl"]["reference_bytes"] == 4 * OBJECTIVES_PARAMS


@pytest.mark.slow  # compiles four learners and VinePPO's sampler: ~40 s on 2 cores
def test_objectives_tiny_reports_every_configuration_against_grpo():
    out = objectives.main(["--tiny"])
    assert set(out) == {"grpo", "grpo_kl", "ppo", "vineppo"}
    check_against_grpo(out)
    assert out["grpo_kl"]["reference_bytes"] == 4 * OBJECTIVES_PARAMS and out["ppo"]["reference_bytes"] == 0
    # 4 rows, a chunk start every 4 of 8 completion tokens: at most 2 prefixes a row, K = 2 continuations
    # each of at most the 8-token budget
    vine = out["vineppo"]
    assert 0 < vine["vineppo_prefixes"] <= 4 * 2
    assert 0 < vine["vineppo_extra_tokens"] <= vine["vineppo_prefixes"] * 2 * 8


def test_sampler_paired_tiny_with_itself_draws_the_same_tokens():
    import jaxrl_llm.rollout.jax_sampler as current

    (row,) = sampler_paired.main(["--tiny", "--before", current.__file__])
    assert (row["batch"], row["max_tokens"]) == (8, 4)
    assert row["before_tokens"] == row["after_tokens"] and 0 < row["after_tokens"] <= 8 * 4  # same program, seed
    assert row["speedup"] == pytest.approx(row["before_s"] / row["after_s"]) and row["speedup"] > 0


def test_sampler_paired_refuses_a_missing_before_file(tmp_path: Path):
    with pytest.raises(SystemExit, match="is not a file"):
        sampler_paired.main(["--tiny", "--before", str(tmp_path / "missing.py")])


def test_moe_experts_tiny_flops_follow_the_forms(tmp_path):
    """Tiny block (D 64, F 32, E 4, k 2, 64 tokens), forward + backward = 3 x forward. Matrix FLOPs of the
    forward by hand: router 2 N D E; dense: 2 N E 3 D F (every expert); active: 2 N k 3 D F; ragged on
    XLA:CPU: a masked dense product over all E groups of the N k rows, 2 N k E 3 D F. XLA's count adds the
    elementwise work (SwiGLU, softmax, gates), a few percent here."""
    n, d, f, e, k = 64, 64, 32, 4, 2
    router = 2 * n * d * e
    active = 3 * (router + 2 * n * k * 3 * d * f)
    dense, ragged_cpu = 3 * (router + 2 * n * e * 3 * d * f), 3 * (router + 2 * n * k * e * 3 * d * f)
    out = moe_experts.main(["--tiny", "--out", str(tmp_path / "moe.json")])
    (row,) = out["rows"]
    assert row["active_flops"] == active == 4816896
    assert dense <= row["compiled_flops"]["dense"] <= 1.1 * dense
    assert ragged_cpu <= row["compiled_flops"]["ragged"] <= 1.1 * ragged_cpu
    assert len(row["ragged_over_dense_time"]) == 2 and all(r > 0 for r in row["ragged_over_dense_time"])
    assert (tmp_path / "moe.json").exists()


@pytest.mark.slow  # 20 s at load 6 on 2 cores (three programs compiled); make test-all
def test_tinker_batching_tiny_times_both_ways_and_their_losses_agree(tmp_path):
    """1 and 2 clients on a tiny random decoder: per round the ratio is the two recorded times' quotient,
    and each client's loss is the same batched, alone and (1 client) on merged params."""
    out = tinker_batching.main(["--tiny", "--out", str(tmp_path / "tb.json")])
    assert [row["clients"] for row in out["rows"]] == [1, 2]
    for row in out["rows"]:
        seconds = row["seconds"]
        assert row["alone_over_batched"] == [a / b for a, b in zip(seconds["alone"], seconds["batched"])]
        assert len(row["alone_over_batched"]) == 2
        losses = row["loss_sum"]
        assert len(losses["batched"]) == row["clients"]
        np.testing.assert_allclose(losses["batched"], losses["alone"], rtol=1e-5)
        np.testing.assert_allclose(losses.get("merged", losses["alone"][:1]), losses["alone"][:1], rtol=1e-5)
    assert "merged" in out["rows"][0]["loss_sum"] and "merged" not in out["rows"][1]["loss_sum"]
    assert (tmp_path / "tb.json").exists()
