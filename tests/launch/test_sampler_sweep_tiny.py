"""The sampler sweep (`benchmarks.gpu.gpu_sampler.sampler_sweep`) at its tiny size on CPU: every
variant runs and is recorded with the decode path and kernel it asked for."""
import json

import pytest

from jaxrl_llm.benchmarks.gpu.gpu_sampler import main, sweep_variants


def test_full_sweep_lists_every_batch_cache_path_and_kernel():
    variants = sweep_variants((64, 256), (1024, 2048), ("compact", "slots"), ("dense", "cudnn", "pallas"))
    assert len(variants) == 2 * 2 * (1 + 3)
    assert {(v["batch"], v["cache_length"]) for v in variants} == {(64, 1024), (64, 2048), (256, 1024), (256, 2048)}
    assert sum(v["decode"] == "slots" and v["kernel"] == "pallas" for v in variants) == 4


@pytest.mark.slow  # 17 s; make test-all since 2026-11-29 (make test time)
def test_tiny_sweep_runs_and_records_every_variant(tmp_path):
    out = tmp_path / "sweep.json"
    assert main(["--out", str(out), "--tiny"]) == 0
    records = json.loads(out.read_text())["records"]
    assert [(r["batch"], r["decode"], r["kernel"]) for r in records] == [
        (b, d, k) for b in (2, 4) for d, k in (("compact", "windowed-dense"), ("slots", "dense"), ("slots", "pallas"))]
    for r in records:
        assert "error" not in r, r
        assert r["decode"] == r["decode"] and r["cache_length"] == 32 and r["new_tokens"] == 16
        assert r["decode_kernel"] == (r["kernel"] if r["decode"] == "slots" else None)
        assert r["decode_tokens_per_s"] > 0 and r["compile_s"] >= 0 and r["roofline_fraction"] > 0
