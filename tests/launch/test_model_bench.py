"""`make bench-model` on a tiny Llama: shape parsing, and one timed shape per dtype whose JAX
loss equals transformers' loss on the same weights (the two engines compute the same thing),
torch running in a worker process of its own, and the table's ratio is the printed tokens/s of
jax over the fastest printed torch thread count."""
from __future__ import annotations

import argparse
import os
import re

import numpy as np
import pytest

from jaxrl_llm.benchmarks.cpu import model as bench
from tests.models.hf_reference import hf_model, our_config_and_params


def test_parse_shapes():
    assert bench.parse_shapes("4x128,2x2048") == [(4, 128), (2, 2048)]
    for bad in ("4", "4x1", "0x128", "ax128"):
        with pytest.raises(SystemExit, match=bad):
            bench.parse_shapes(bad)


def printed_tokens_per_s(out: str) -> dict[str, float]:
    """{"jax": tok/s, "torch-<threads>": tok/s} from the per-engine lines."""
    found = {}
    for line in out.splitlines():
        match = re.search(r"2x24 (jax|torch \((\d+) thread).*?([\d.]+) tokens/s", line)
        if match:
            found["jax" if match[1] == "jax" else f"torch-{match[2]}"] = float(match[3])
    return found


@pytest.mark.slow  # 21 s, make test-all since 2026-11-29 (make test time)
@pytest.mark.parametrize("dtype, tol, profile", [("float32", 1e-5, True),
                                                 pytest.param("bfloat16", 2e-2, False, marks=pytest.mark.slow)])
def test_one_shape_times_both_engines_on_the_same_loss(dtype, tol, profile, capsys, tmp_path):
    model = hf_model("llama_tied")
    model.save_pretrained(tmp_path)  # what the torch worker loads
    cfg, params = our_config_and_params(model)
    args = argparse.Namespace(warmup=0, iters=1, chunk_size=8, skip_torch=False, torch_threads=[1, 2],
                              profile=profile, remat="auto", torch_device="cpu")
    table = bench.ratio_table(cfg, params, str(tmp_path), [(2, 24)], [dtype], args)
    result = table[(dtype, "2x24")]
    assert set(result.throughput) == {"jax", "torch-1", "torch-2"} and min(result.throughput.values()) > 0
    assert result.torch_pid not in (None, os.getpid())  # torch ran in another process
    assert 0 < result.jax_peak_rss < 9e9 and 1e8 < result.torch_peak_rss < 9e9  # torch alone is > 100 MB

    out = capsys.readouterr().out
    losses = [float(line.rsplit("loss", 1)[1]) for line in out.splitlines() if " loss " in line]
    assert len(losses) == 3 and losses[0] == pytest.approx(losses[1], rel=tol) == losses[2]
    assert losses[0] == pytest.approx(np.log(cfg.vocab_size), rel=0.5)  # random tokens: near-uniform
    assert out.count("phase ") == (4 if profile else 0)

    printed = printed_tokens_per_s(out)
    best = max(("torch-1", "torch-2"), key=printed.get)
    row = re.search(rf"{dtype}\s+2x24\s+([\d.]+)\s+(torch-\d)\s+([\d.]+)\s+([\d.]+)x\s+([\d.]+) GB\s+([\d.]+) GB", out)
    assert row, out
    assert float(row[1]) == printed["jax"] and row[2] == best and float(row[3]) == printed[best]
    assert float(row[4]) == pytest.approx(printed["jax"] / printed[best], rel=2e-3, abs=6e-3)
    assert float(row[6]) == pytest.approx(result.torch_peak_rss / 1e9, abs=0.006)


def test_remat_auto_threshold():
    gib = 2**30
    assert not bench.needs_remat(1 * gib, 24 * gib)  # 4x128 float32: 1.1 GiB saved
    assert bench.needs_remat(11 * gib, 24 * gib)  # 8x512: 11.3 GiB, the torch model beside it
    assert not bench.needs_remat(11 * gib, 128 * gib)


def test_remat_auto_skips_dots_in_bfloat16_on_cpu():
    # measured: bf16 "full" beats "dots" on XLA:CPU (1.16x at 8x512), float32 the reverse (0.94x)
    assert bench.auto_remat_order("bfloat16", "cpu") == ("off", "full")
    assert bench.auto_remat_order("float32", "cpu") == ("off", "dots", "full")
    assert bench.auto_remat_order("bfloat16", "gpu") == ("off", "dots", "full")


def test_remat_auto_budgets_the_cpu_by_the_machine_ram():
    import jax
    with open("/proc/meminfo") as meminfo:  # MemTotal is the RAM less the kernel's reserve: within 5%
        total_kib = next(int(line.split()[1]) for line in meminfo if line.startswith("MemTotal:"))
    assert bench.memory_bytes(jax.devices("cpu")[0]) == pytest.approx(total_kib * 1024, rel=0.05)


def test_torch_labels_name_threads_on_cpu_and_the_gpu():
    assert bench.torch_label("torch-2") == "2 thread(s)" and bench.torch_label("torch-cuda") == "cuda"
    cpu = argparse.Namespace(torch_device="cpu", torch_threads=[1, 2])
    assert bench.torch_runs(cpu) == {"torch-1": 1, "torch-2": 2}
    assert bench.torch_runs(argparse.Namespace(torch_device="cuda", torch_threads=[1, 2])) == {"torch-cuda": 1}
