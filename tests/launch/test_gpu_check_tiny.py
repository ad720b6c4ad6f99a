"""`make gpu-check` on CPU at tiny shapes: the FLOP count by hand, the RL length mix, a failed
section recorded without stopping the rest, and one whole tiny run writing its JSON and tables."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from jaxrl_llm.benchmarks.common import rl_batch
from jaxrl_llm.benchmarks.gpu import gpu_check, gpu_check_report
from jaxrl_llm.benchmarks.gpu.learner_gpu import model_config
from jaxrl_llm.train.learn.batch import SequenceBatch


def test_learner_flops_by_hand():
    cfg = model_config("tiny", 64)
    # two sequences: prompt 2 + completion 3 (5 tokens), prompt 1 + completion 1 (2 tokens)
    attention = np.array([[0, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0, 0]])
    completion = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    seq = SequenceBatch(np.zeros_like(attention), attention, attention, completion, completion, np.zeros(2, bool), 3)
    # layers: 2 x (64*16*(4+2*2) + 4*16*64 + 3*64*128) = 73728; head 64 x 512 on 4 completion tokens;
    # causal contexts 5*6/2 + 2*3/2 = 18
    expected = 6 * 73728 * 7 + 6 * 64 * 512 * 4 + 12 * 2 * 4 * 16 * 18
    assert rl_batch.learner_flops(cfg, seq)["flops"] == expected


def test_moe_learner_flops_count_active_parameters_by_hand():
    """tiny-moe (D 64, 4 heads / 2 kv of 16, 4 experts of width 32, top-2, vocab 512, 2 layers) on the
    same two sequences: MFU's count takes the router and k = 2 experts per token, the dense-work count
    all 4; the active body also equals num_active_params() less the embedding, head and norms."""
    cfg = model_config("tiny-moe", 64)
    attention = np.array([[0, 1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0, 0]])
    completion = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    seq = SequenceBatch(np.zeros_like(attention), attention, attention, completion, completion, np.zeros(2, bool), 3)
    # per layer: attention 64*16*(4+2*2) + 4*16*64 = 12288; router 64*4 = 256; one expert 3*64*32 = 6144
    active, dense = 2 * (12288 + 256 + 2 * 6144), 2 * (12288 + 256 + 4 * 6144)
    rest = 6 * 64 * 512 * 4 + 12 * 2 * 4 * 16 * 18  # head on 4 completion tokens; causal contexts 18
    flops = rl_batch.learner_flops(cfg, seq)
    assert (flops["flops"], flops["dense_work_flops"]) == (6 * active * 7 + rest, 6 * dense * 7 + rest)
    norms = 2 * (2 * 64 + 2 * 16) + 64  # input/post norms and q/k norms per layer, the final norm
    assert rl_batch.body_params(cfg) == cfg.num_active_params() - 2 * 512 * 64 - norms
    big = model_config("qwen3-30b-a3b-4l", 2048)  # Qwen3-30B-A3B's layer: 128 experts, top-8
    assert rl_batch.body_params(big, 128) - rl_batch.body_params(big) == 4 * 3 * 2048 * 768 * 120
    assert (big.num_experts, big.num_experts_per_tok, big.num_heads, big.num_kv_heads) == (128, 8, 32, 4)


def test_moe_row_names_the_experts_form_and_its_work():
    """"auto" is dense on CPU (E/k = 2 times the needed expert FLOPs for tiny-moe), off CPU the ragged
    forward (1x) with the dense gradient (2 x 2: the dense forward again and its backward): 5/3."""
    auto_off_cpu = "ragged forward, dense gradient"
    assert [gpu_check.experts_form("auto", b) for b in ("cpu", "gpu", "tpu")] == ["dense", auto_off_cpu, auto_off_cpu]
    assert gpu_check.experts_form("dense", "gpu") == "dense"
    flops = {"dense_work_flops": 8e12}
    cfg = model_config("tiny-moe", 64)
    row = gpu_check.moe_fields(cfg, flops, seconds=2.0, peak_tflops=None)  # on this CPU
    assert (row["experts_form"], row["expert_work_over_needed"], row["dense_work_tflops"]) == ("dense", 2.0, 4.0)
    assert gpu_check.expert_work_over_needed(auto_off_cpu, 4, 2) == (1 + 3 * 2) / 3
    ragged = gpu_check.moe_fields(dataclasses.replace(cfg, moe_experts="ragged"), flops, 2.0, None)
    assert (ragged["experts_form"], ragged["expert_work_over_needed"]) == ("ragged", None)


def test_rl_length_mix_reaches_its_target_in_whole_groups():
    seq, rewards = rl_batch.rl_length_mix(20000, rl_batch.LengthMix(), vocab=1000)
    n = seq.tokens.shape[0]
    tokens = seq.attention_mask.sum()
    assert n % rl_batch.GROUP == 0 and rewards.shape == (n // rl_batch.GROUP, rl_batch.GROUP)
    assert 20000 <= tokens < 20000 + 8 * 2048
    prompts = seq.attention_mask[:, :seq.prompt_width].sum(1)
    assert prompts.min() >= 200 and prompts.max() <= 312
    np.testing.assert_array_equal(seq.completion_mask.sum(1), seq.attention_mask[:, seq.prompt_width:].sum(1))
    # long-tailed: the mean completion well above the median
    lengths = seq.completion_mask.sum(1)
    assert lengths.mean() > 1.15 * np.median(lengths)


def test_a_failing_section_is_recorded_and_the_run_goes_on(tmp_path):
    report = gpu_check_report.Report(tmp_path, tiny=True, budget_s=100.0)

    def broken():
        raise RuntimeError("planted")

    assert report.section("first", 1, broken) is None
    assert report.section("second", 1, lambda: 7) == 7
    assert report.section("third", 1000, lambda: 8) is None  # over the budget: skipped, not run
    data = json.loads(report.path.read_text())
    assert data["sections"]["first"]["status"] == "failed" and "planted" in data["sections"]["first"]["error"]
    assert data["sections"]["second"]["status"] == "ok"
    assert data["sections"]["third"]["status"] == "skipped"


@pytest.mark.slow  # make gpu-preflight / test-all: the GPU script end to end at tiny size (~2 min)
@pytest.mark.timeout(900)
def test_tiny_run_writes_every_section(tmp_path):
    """Every section (the torch reference eager and compiled) but the RL run, which tests/launch/test_gpu_rl_tiny.py runs through the same
    function (`gpu_rl.rl_end_to_end`) and which is the slowest at tiny size (~2 min on 2 cores)."""
    sections = "torch,ceilings,attention,learner,learner_phases,batch_invariance,sampler,rl_step"
    assert gpu_check.main(["--tiny", "--out-dir", str(tmp_path), "--only", sections]) == 0
    (path,) = tmp_path.glob("gpu-check-*-tiny-*.json")
    data = json.loads(path.read_text())
    failed = {k: v.get("error") for k, v in data["sections"].items() if v["status"] != "ok"}
    assert not failed, failed
    rows = {r["pack"]: r for r in data["learner"] if r["model"] == "tiny"}
    assert rows[True]["padding_fraction"] < rows[False]["padding_fraction"]
    (moe,) = [r for r in data["learner"] if r["model"] == "tiny-moe"]  # MFU on active params, dense work beside it
    assert moe["mfu_basis"] == "active parameters" and moe["expert_work_over_needed"] == 2.0
    assert moe["experts_form"] == "dense"  # "auto" on CPU
    assert moe["dense_work_flops_per_step"] > moe["flops_per_step"] and moe["active_params"] < moe["params"]
    assert rows[True]["flops_per_step"] == rows[False]["flops_per_step"]  # the same work, laid out differently
    for name in ("sampler", "rl_step", "torch", "learner_phases"):
        assert data[name] is not None, name
    runs = {run["mode"]: run for run in data["torch"]["runs"]}
    assert list(runs) == ["eager", "torch.compile", "packed eager"]
    assert data["torch"]["tokens_per_step"] == rows[False]["tokens_per_step"]  # the same batch on both sides
    # packed, one row holds several sequences: the loss at the initial weights is the one-per-row loss
    # only if no sequence attends to another (float32 on CPU: summation order only)
    assert runs["packed eager"]["first_loss"] == pytest.approx(runs["eager"]["first_loss"], rel=1e-5, abs=1e-7)
    assert "not run: no CUDA device" in runs["packed eager"]["attention"]
    markdown = path.with_suffix(".md").read_text()
    assert "| tiny |" in markdown and "packed eager" in markdown and "Winner, head" in markdown
    assert "MFU on active parameters" in markdown and "| tiny-moe |" in markdown
    phases = data["learner_phases"]
    assert set(phases["phases"]) == {"layers", "head", "micro_step", "optimizer"}
    assert set(phases["head_levers"]) == {"baseline", "chunk_32", "logits_bf16", "matmul_f32"}
    assert all("ms" in r and r["fraction_of_matmul"] > 0 for r in phases["head_levers"].values())
    assert {"baseline", "remat_dots", "remat_full"} <= set(phases["layer_levers"])
    assert "no cuDNN attention" in phases["layer_levers"]["attention_cudnn_segments"]["skipped"]
    for phase in ("head", "layers"):  # the winner is the fastest lever, its speedup baseline ms / its ms
        won, levers = phases["winner"][phase], phases[f"{'head' if phase == 'head' else 'layer'}_levers"]
        fastest = min((r["ms"], name) for name, r in levers.items() if "ms" in r)[1]
        assert won["lever"] == fastest
        assert won["speedup_vs_baseline"] == pytest.approx(levers["baseline"]["ms"] / levers[fastest]["ms"])
    invariance = data["batch_invariance"]
    for key, entry in invariance["exactness"].items():  # bf16 and fp32, flag on: no log-prob differs
        if key.endswith("batch_invariant=True"):
            assert entry["tokens"] > 0 and not any(entry["differing"].values()), (key, entry)
    assert {k.split()[0] for k in invariance["exactness"]} == {"bfloat16", "float32"}
    cost = invariance["sampler_cost"]
    assert cost["on_over_off"] == pytest.approx(cost["tokens_per_s_on"] / cost["tokens_per_s_off"])
    assert data["estimates_s"]["learner_phases"] > 0 and "rl_run" not in data["sections"]


def test_phase_flops_add_up_to_the_step():
    """The per-micro-batch FLOPs of learner_phases, summed over the micro-batches of a packed
    step, equal the step's count by learner_flops (a second formulation of the same sum)."""
    from jaxrl_llm.benchmarks.gpu.learner_phases import phase_flops
    from jaxrl_llm.train.learn.packing import plan_rows

    cfg = model_config("tiny", 64)
    seq, _ = rl_batch.rl_length_mix(600, rl_batch.TINY_MIX, cfg.vocab_size)
    plan = plan_rows(seq.tokens, seq.attention_mask, seq.prompt_width, rows_per_micro=2, pack=True)
    total = 0.0
    for m in np.flatnonzero(plan.used):
        members = np.flatnonzero(plan.micro_batch == m)
        parts = phase_flops(cfg, seq.attention_mask[members].sum(1), int(seq.completion_mask[members].sum()))
        total += parts["layers"] + parts["head"]
    assert total == pytest.approx(rl_batch.learner_flops(cfg, seq)["flops"], rel=1e-12)


def test_section_order_and_estimates_from_a_fake_result(tmp_path):
    """The plan runs the headline learner row before the slow compiles, and a recorded wall longer than
    the table's raises the estimate (a fake result file of an earlier run on the same device)."""
    from jaxrl_llm.benchmarks.gpu import gpu_check_sections as plan

    learner, samplers = gpu_check.job_names(tiny=False)
    order = plan.run_order(learner, samplers)
    assert order[:5] == ["ceilings", "attention", "learner:qwen2.5-1.5b:65536:packed", "learner_phases",
                         "batch_invariance"]
    assert order[5] == "learner:qwen3-30b-a3b-4l:16384:packed"  # the MoE shape, measured nowhere else
    assert order.index("learner:qwen2.5-1.5b:16384:rows") < order.index("sampler:64") < order.index("rl_run")
    assert order[-1] == "learner:qwen2.5-0.5b:16384:rows" and sorted(order) == sorted(
        ["ceilings", "attention", "learner_phases", "batch_invariance", "rl_step", "rl_run", *learner, *samplers])
    fake = {"tiny": False, "date": "2026-11-28", "sections": {"rl_run": {"status": "ok", "wall_s": 300.0},
                                                              "ceilings": {"status": "ok", "wall_s": 1.0},
                                                              "attention": {"status": "failed", "wall_s": 900.0}}}
    (tmp_path / "gpu-check-nvidia-h100-80gb-hbm3-2026-11-28.json").write_text(json.dumps(fake))
    # an older run sampled with the compacting decode: its sampling walls say nothing of the slot decode
    old = {"tiny": False, "date": "2026-11-26", "sections": {"sampler:64": {"status": "ok", "wall_s": 185.0},
                                                             "attention": {"status": "ok", "wall_s": 40.0}}}
    (tmp_path / "gpu-check-nvidia-h100-80gb-hbm3-2026-11-26-c.json").write_text(json.dumps(old))
    got = plan.section_estimates(["rl_run", "ceilings", "attention", "sampler:64"], tiny=False, results_dir=tmp_path,
                                 device_kind="NVIDIA H100 80GB HBM3")
    assert got == {"rl_run": 300.0, "ceilings": plan.GPU_ESTIMATES_S["ceilings"],
                   "attention": 40.0,  # the older ok run; the newer failed run's wall is not an estimate
                   "sampler:64": plan.GPU_ESTIMATES_S["sampler:64"]}


def test_the_winner_is_the_fastest_lever_by_hand():
    from jaxrl_llm.benchmarks.gpu.learner_phases import winner

    levers = {"baseline": {"ms": 90.0, "fraction_of_matmul": 0.16}, "chunk_1024": {"ms": 45.0},
              "logits_bf16": {"ms": 60.0}, "attention_cudnn_mask": {"skipped": "no cuDNN"}, "x": {"error": "OOM"}}
    assert winner(levers) == {"lever": "chunk_1024", "ms": 45.0, "baseline_ms": 90.0, "speedup_vs_baseline": 2.0,
                              "fraction_of_matmul": None}
    assert winner({"chunk_1024": {"ms": 1.0}})["lever"] is None  # no baseline, no ratio
