"""The GPU measurements of the sampler and the RL stack (benchmarks/gpu/gpu_sampler.py, gpu_rl.py)
at tiny sizes on CPU: roofline bytes against a count by hand, the z-test against a hand
computation, the RL step's time split, and the end-to-end run: held-out counts, the per-step
split read back from metrics.jsonl, and (the tiny setting learns on CPU: 0.194 -> 0.282
measured) success after > before."""
from __future__ import annotations

import json
import math
import os

import pytest

from jaxrl_llm.benchmarks.common import addition_start
from jaxrl_llm.benchmarks.gpu import gpu_rl, gpu_sampler


def test_roofline_bytes_of_the_tiny_shape_by_hand():
    # tiny: vocab 512, hidden 64, MLP 128, 2 layers, 4 heads + 2 KV heads of 16, q/k/v biases, tied head.
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64  # q, k+v, o, MLP, 2 norms
    params = 512 * 64 + 2 * per_layer + 64  # embedding (= LM head), layers, final norm
    out = gpu_sampler.sampler_decode("tiny", 8, 8, prompt_len=16, tiny=True, repeats=1)
    assert out["weight_bytes"] == 2 * params == 214144  # bfloat16
    # K and V, 2 layers x 2 heads x 16 x 2 bytes per slot, 8 rows, mean context 16 + (8 + 1) / 2
    assert out["kv_bytes_per_step"] == 2 * 2 * 2 * 16 * 2 * 8 * (16 + 4.5)
    assert out["roofline_fraction"] == pytest.approx(
        8 * (out["weight_bytes"] + out["kv_bytes_per_step"]) / out["decode_s"] / out["copy_bandwidth_Bps"])
    assert out["decode_tokens_per_s"] == pytest.approx(8 * 8 / out["decode_s"])
    assert out["decode_s"] <= out["generate_s"] and out["prefill_s"] > 0
    assert out["device_kind"] == "cpu" and "kv_bytes_per_step" in out["roofline_formula"]
    json.dumps(out)  # no numpy scalars


def test_copy_bandwidth_counts_read_and_write():
    out = gpu_sampler.copy_bandwidth(1 << 20, repeats=3)
    assert out["copy_bytes"] == 1 << 20
    assert out["copy_bandwidth_Bps"] == pytest.approx(2 * (1 << 20) / out["copy_seconds_median"])


def test_short_rows_are_refused():
    from types import SimpleNamespace

    record = SimpleNamespace(num_completion_tokens=3, finish_reason="stop")
    with pytest.raises(RuntimeError, match="decode 8 tokens"):
        gpu_sampler.check_full_length(SimpleNamespace(records=[record]), 8)


def test_two_proportion_z_by_hand():
    # 10/100 -> 20/100: pooled 0.15, se = sqrt(0.15 * 0.85 * 0.02) = 0.0504975, z = 1.98030
    out = gpu_rl.two_proportion_z(10, 100, 20, 100)
    assert out["z"] == pytest.approx(0.1 / math.sqrt(0.15 * 0.85 * 0.02))
    assert out["p_value_two_sided"] == pytest.approx(0.04767, abs=1e-4)
    assert out["p_value_one_sided_increase"] == pytest.approx(out["p_value_two_sided"] / 2)


@pytest.mark.slow  # 18 s; make test-all since 2026-11-29 (make test time)
def test_rl_step_split_parts_sum_to_at_most_the_step():
    out = gpu_rl.rl_step_at_scale(tiny=True)
    parts = out["sample_s"] + out["grade_s"] + out["learn_s"] + out["sync_s"]
    assert 0 < parts <= out["step_s"] + 1e-6
    assert out["batch"] == 4 and out["new_tokens"] == 8 and out["sampler_dtype"] == "bfloat16"
    assert out["warmup"]["step_s"] >= out["step_s"] and out["compile_s"] >= 0
    json.dumps(out)


@pytest.mark.slow  # make gpu-preflight / test-all: the GPU script end to end at tiny size (~2 min)
@pytest.mark.timeout(600)  # ~2 min on 2 idle cores
def test_rl_end_to_end_tiny_learns(tmp_path):
    from jaxrl_llm.data import HELDOUT, make_task
    from jaxrl_llm.train.run.metrics import read_metrics

    out = gpu_rl.rl_end_to_end(str(tmp_path), tiny=True)
    json.dumps(out)
    heldout = len(make_task("addition", digits=1).all_examples(HELDOUT))
    assert heldout == 29
    for side in ("before", "after"):
        assert out[side]["samples"] == heldout * addition_start.E2E_TINY.eval_samples
        assert out[side]["success_rate"] == out[side]["successes"] / out[side]["samples"]
    assert 0.05 < out["success_before"] < 0.45  # the SFT start: low but not zero
    assert out["success_after"] > out["success_before"]  # CPU, seed 0: 0.194 -> 0.282, p = 0.002
    assert 0 < out["p_value_two_sided"] < 1
    records = [r for r in read_metrics(os.path.join(tmp_path, "run")) if "time_step_s" in r]
    assert [r["step"] for r in records] == list(range(1, 11)) and out["rl_steps"] == 10
    assert out["time_per_step"]["time_learn_s"] == [r["time_learn_s"] for r in records]
    for r in records:
        assert r["time_wait_s"] + r["time_learn_s"] + r["time_sync_s"] <= r["time_step_s"] + 1e-6
    split = out["time_split_median_s"]
    assert set(split) == {"rollout_s", "reward_s", "wait_s", "learn_s", "sync_s", "step_s"}
    assert os.path.isfile(os.path.join(out["sft"]["model_dir"], "tokenizer.json"))
