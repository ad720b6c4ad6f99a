"""`make gpu-sweep` on CPU at tiny shapes: the grid's order, the budget's skips, a failing variant
recorded while the sweep goes on, and one whole tiny run writing every variant to its JSON."""
from __future__ import annotations

import json
import time

import pytest

from jaxrl_llm.benchmarks.gpu import gpu_sweep
from jaxrl_llm.benchmarks.gpu.gpu_sweep import Budget, Variant
from jaxrl_llm.benchmarks.common.rl_batch import TINY_MIX

RECORD_KEYS = {"name", "chunk", "attention", "remat", "status"}
OK_KEYS = {"seconds", "tokens_per_s", "mfu", "fraction_of_matmul_ceiling", "first_step_s", "wall_s"}


def test_the_grid_runs_the_baseline_then_single_changes_then_the_rest():
    got = gpu_sweep.learner_variants((128, 1024), ("xla", "cudnn_mask"), ("off", "full"))
    # by hand: baseline (128, xla, off); one change: chunk / attention / remat; then the 4 with two or three
    assert got[0] == Variant(128, "xla", "off")
    assert set(got[1:4]) == {Variant(1024, "xla", "off"), Variant(128, "cudnn_mask", "off"),
                             Variant(128, "xla", "full")}
    assert len(got) == len(set(got)) == 8
    assert got[-1] == Variant(1024, "cudnn_mask", "full")


def test_run_recorded_skips_over_budget_and_records_errors():
    budget = Budget(10.0)
    assert gpu_sweep.run_recorded("a", 11.0, budget, lambda: {"x": 1})["status"] == "skipped"
    ok = gpu_sweep.run_recorded("b", 1.0, budget, lambda: {"x": 1})
    assert ok["status"] == "ok" and ok["x"] == 1 and ok["wall_s"] >= 0

    def broken():
        raise RuntimeError("planted")

    failed = gpu_sweep.run_recorded("c", 1.0, budget, broken)
    assert failed["status"] == "failed" and "RuntimeError: planted" in failed["error"]
    assert gpu_sweep.estimate([{"status": "ok", "wall_s": 3.0}, {"status": "skipped"}, {"status": "failed",
                                                                                       "wall_s": 5.0}], 99) == 4.0
    assert gpu_sweep.estimate([], 99) == 99


@pytest.mark.slow  # 18 s; make test-all since 2026-11-29 (make test time); make test keeps gpu_check's failing-section test
def test_a_failing_variant_is_recorded_and_the_next_one_runs():
    """Chunk 0 is a bad LM-head chunk: the learner's trace reads it from the environment and fails
    (so the switch reaches a fresh Learner's trace); the next variant still runs."""
    variants = [Variant(0, "xla", "off"), Variant(32, "cudnn_segments", "off"), Variant(32, "xla", "full")]
    written = []
    records = gpu_sweep.learner_sweep(
        variants, model="tiny", tokens_per_step=256, micro_batch_tokens=2 * (TINY_MIX.prompt_width
                                                                              + TINY_MIX.completion_width),
        steps=1, mix=TINY_MIX, budget=Budget(600.0), first_guess_s=1.0, peak_tflops=None, matmul_tflops=None,
        on_record=lambda r: written.append(len(r)), head_dim=16)
    assert [r["status"] for r in records] == ["failed", "skipped", "ok"]
    assert "chunk_size=0 must be a positive int" in records[0]["error"]
    assert "no cuDNN attention" in records[1]["reason"]
    assert OK_KEYS <= set(records[2]) and records[2]["seconds"] > 0
    assert written == [1, 3]  # after every variant that ran (a skip by backend is written with the next)
    assert gpu_sweep.best_variant(records)["speedup_vs_baseline"] is None  # the baseline failed


@pytest.mark.slow  # make gpu-preflight / test-all: the GPU script end to end at tiny size (~2 min)
@pytest.mark.timeout(900)
def test_tiny_sweep_writes_every_variant(tmp_path):
    t0 = time.time()
    assert gpu_sweep.main(["--tiny", "--out-dir", str(tmp_path), "--budget-s", "100"]) == 0
    wall = time.time() - t0
    (path,) = tmp_path.glob("gpu-sweep-*-tiny-*.json")
    data = json.loads(path.read_text())
    names = [r["name"] for r in data["learner"]]
    # the default tiny grid: 2 chunks x 3 attention paths x 3 remat modes, baseline first (XLA on CPU)
    assert len(names) == len(set(names)) == 18 and names[0] == "chunk32-xla-off"
    for record in data["learner"]:
        assert RECORD_KEYS <= set(record), record
        assert record["status"] in ("ok", "failed", "skipped"), record
        if record["status"] == "ok":
            assert OK_KEYS <= set(record)
        elif record["status"] == "skipped":
            assert record["reason"]
    assert data["learner"][0]["status"] == "ok" and data["best"]["baseline"] == "chunk32-xla-off"
    assert all(r["status"] == "skipped" for r in data["learner"] if r["attention"] != "xla")
    # batches 4 and 8 x one cache of 16 + 8 slots x (compact, slots with dense, slots with pallas): no cuDNN on CPU
    assert [(r["batch"], r["max_tokens"], r["decode"], r["kernel"]) for r in data["sampler"]] == [
        (b, 8, d, k) for b in (4, 8) for d, k in (("compact", "windowed-dense"), ("slots", "dense"), ("slots", "pallas"))]
    assert data["sampler"][0]["status"] in ("ok", "skipped")
    assert data["ceilings"]["matmul_tflops"] > 0
    print(f"tiny sweep wall {wall:.0f} s; learner statuses {[r['status'] for r in data['learner']]}")
