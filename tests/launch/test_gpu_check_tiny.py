"""`make gpu-check` on CPU at tiny shapes: the FLOP count by hand, the RL length mix, a failed
section recorded without stopping the rest, and one whole tiny run writing its JSON and tables."""
from __future__ import annotations

import json

import numpy as np
import pytest

from jaxrl_llm.benchmarks import gpu_check, gpu_check_report, rl_batch
from jaxrl_llm.benchmarks.learner_gpu import model_config
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


@pytest.mark.timeout(900)
def test_tiny_run_writes_every_section(tmp_path):
    """Every section (the torch reference eager and compiled) but the RL run, which tests/launch/test_gpu_rl_tiny.py runs through the same
    function (`gpu_rl.rl_end_to_end`) and which is the slowest at tiny size (~2 min on 2 cores)."""
    sections = "torch,ceilings,attention,learner,learner_phases,sampler,rl_step"
    assert gpu_check.main(["--tiny", "--out-dir", str(tmp_path), "--only", sections]) == 0
    (path,) = tmp_path.glob("gpu-check-*-tiny-*.json")
    data = json.loads(path.read_text())
    failed = {k: v.get("error") for k, v in data["sections"].items() if v["status"] != "ok"}
    assert not failed, failed
    rows = {r["pack"]: r for r in data["learner"]}
    assert rows[True]["padding_fraction"] < rows[False]["padding_fraction"]
    assert rows[True]["flops_per_step"] == rows[False]["flops_per_step"]  # the same work, laid out differently
    for name in ("sampler", "rl_step", "torch", "learner_phases"):
        assert data[name] is not None, name
    assert [run["mode"] for run in data["torch"]["runs"]] == ["eager", "torch.compile"]
    assert data["torch"]["tokens_per_step"] == rows[False]["tokens_per_step"]  # the same batch on both sides
    assert "| tiny |" in path.with_suffix(".md").read_text()
    assert set(data["learner_phases"]["phases"]) == {"layers", "head", "micro_step", "optimizer"}


def test_phase_flops_add_up_to_the_step():
    """The per-micro-batch FLOPs of learner_phases, summed over the micro-batches of a packed
    step, equal the step's count by learner_flops (a second formulation of the same sum)."""
    from jaxrl_llm.benchmarks.learner_phases import phase_flops
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
