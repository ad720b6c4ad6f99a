"""docs/benchmarks.md's accelerator tables come from the committed gpu-check result files: rows built
from a hand-written result, tiny CPU runs left out, and the tables in docs/benchmarks.md equal to the
generated ones."""
from __future__ import annotations

import json

import pytest

from jaxrl_llm.reports import accelerator_table as at


def result(tiny: bool = False) -> dict:
    return {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26", "commit": "abc1234", "tiny": tiny,
            "learner": [{"model": "qwen2.5-1.5b", "tokens_per_step": 65536, "pack": True, "padding_fraction": 0.05,
                         "remat": "off", "tokens_per_s": 30000.4, "mfu": 0.4}],
            "sampler": [], "rl_run": None, "rl_step": None}


def test_rows_name_device_date_commit(tmp_path):
    (tmp_path / "gpu-check-h100-2026-11-26.json").write_text(json.dumps(result()))
    (tmp_path / "gpu-check-cpu-tiny-2026-11-26.json").write_text(json.dumps(result(tiny=True) | {"device": "cpu"}))
    text = at.table(at.load_results(tmp_path))
    assert "| NVIDIA H100 80GB HBM3 | 2026-11-26 | abc1234 | qwen2.5-1.5b | 65536 | packed | segments | 5.0 % | off | " \
        "30,000 | 40.0 % |" in text
    assert "| cpu |" not in text


def test_markers_are_required(tmp_path):
    with pytest.raises(ValueError, match="no accelerator-table markers"):
        at.replace_between_markers("# readme\n", "x")
    text = f"a\n{at.START}\nold\n{at.END}\nb\n"
    assert at.replace_between_markers(text, "new") == f"a\n{at.START}\nnew\n{at.END}\nb\n"


def test_benchmarks_doc_table_is_the_generated_one():
    assert at.TARGET.name == "benchmarks.md" and at.TARGET.parent.name == "docs"
    assert at.main(["--check"]) == 0


def test_check_fails_on_a_stale_table(tmp_path, capsys):
    doc = tmp_path / "benchmarks.md"
    doc.write_text(f"# b\n{at.START}\nstale\n{at.END}\n")
    assert at.main(["--check", "--doc", str(doc)]) == 1
    assert "stale" in capsys.readouterr().err
    assert at.main(["--doc", str(doc)]) == 0
    assert at.main(["--check", "--doc", str(doc)]) == 0


def test_lever_invariance_and_packed_torch_rows(tmp_path):
    data = result() | {
        "learner_phases": {"model": "qwen2.5-1.5b", "winner": {
            "head": {"lever": "chunk_2048", "ms": 45.0, "baseline_ms": 90.0, "speedup_vs_baseline": 2.0,
                     "fraction_of_matmul": 0.32},
            "layers": {"lever": None, "reason": "the baseline did not run"}}},
        "batch_invariance": {"exactness": {
            "bfloat16 batch_invariant=True": {"tokens": 9, "differing": {"together": 0, "split": 0}},
            "bfloat16 batch_invariant=False": {"tokens": 9, "differing": {"together": 4}},
            "float32 batch_invariant=True": {"tokens": 9, "differing": {"together": 0}}},
            "sampler_cost": {"on_over_off": 0.61}},
        "torch": {"model": "qwen2.5-1.5b", "tokens_per_step": 25570, "runs": [
            {"mode": "packed eager", "attention": "sdpa block mask", "tokens_per_s": 20000.0, "mfu": 0.2}],
            "failed": [{"mode": "compile", "error": "InductorError: planted"}]}}
    (tmp_path / "gpu-check-h100-2026-11-26.json").write_text(json.dumps(data))
    text = at.table(at.load_results(tmp_path))
    assert "| qwen2.5-1.5b | head | chunk_2048 | 90.0 -> 45.0 | 2.00x | 32.0 % |" in text
    assert "| layers |" not in text  # no winner, no row
    assert "| bfloat16: 0, float32: 0 | 0.61 |" in text
    assert "| packed eager | sdpa block mask | 20,000 | 20.0 % |" in text
    assert "| compile | not run: InductorError: planted | - | - |" in text
