"""The GPU learner benchmark's code path on CPU (--tiny shapes): FLOP count against the
parameter tree, packing that keeps every sequence, packed loss == padded loss, and one
run of every variant."""
from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrl_llm.benchmarks.gpu import learner_gpu as bench
from jaxrl_llm.models import init_params


def test_matmul_params_equal_the_parameter_tree():
    for name in ("tiny", "qwen2.5-0.5b"):
        cfg = bench.model_config(name, 64)
        shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
        flat = {jax.tree_util.keystr(p): np.prod(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(shapes)}
        counted = sum(v for k, v in flat.items() if k.endswith("_proj']")) + flat["['embed']"]  # tied LM head
        assert bench.matmul_params(cfg) == counted
    # Qwen2.5-0.5B: 494M parameters in total (HF model card); matmuls = all but norms and biases.
    assert bench.matmul_params(bench.model_config("qwen2.5-0.5b", 64)) == pytest.approx(494e6, rel=0.01)


def test_train_flops_by_hand():
    cfg = bench.model_config("tiny", 64)
    # 2 layers x (64*16*(4+2*2) + 4*16*64 + 3*64*128) + 64*512 = 106496 matmul weights
    # lengths 1 and 3: 4 tokens, causal contexts 1 + (1+2+3) = 7
    assert bench.train_flops(cfg, np.array([1, 3])) == 6 * 106496 * 4 + 12 * 2 * 4 * 16 * 7


def test_packing_keeps_every_token_once_in_fewer_rows():
    lengths = np.array([60, 10, 30, 20, 64, 4])
    padded = bench.padded_batch(lengths, 64, vocab=512)
    packed = bench.pack(padded, 64)
    # first-fit decreasing, rows of 64: [64], [60, 4], [30, 20, 10]
    assert packed["tokens"].shape[0] == 3
    assert sorted(map(tuple, [sorted(np.bincount(s[s > 0])[1:].tolist()) for s in packed["segment_ids"]])) == \
        [(4, 60), (10, 20, 30), (64,)]
    got = sorted(tuple(row[seg == s]) for row, seg in zip(packed["tokens"], packed["segment_ids"])
                 for s in range(1, seg.max() + 1))
    want = sorted(tuple(padded["tokens"][i, :n]) for i, n in enumerate(lengths))
    assert got == want
    assert packed["loss_mask"].sum() == padded["loss_mask"].sum() == (lengths - 1).sum()


@pytest.mark.slow  # 19 s; make test-all since 2026-11-29 (make test time); packed = padded stays in tests/train/test_packing.py
def test_tiny_run_packed_loss_equals_padded_loss():
    rows = bench.run("tiny", "fp32", batch=8, seq_len=64, steps=1, peak_tflops=1.0, matmul_n=128, micro_batch=4)
    by_variant = {r["variant"]: r for r in rows}
    assert set(by_variant) == {"padded", "packed", "learner"}
    assert by_variant["packed"]["loss"] == pytest.approx(by_variant["padded"]["loss"], rel=1e-5)
    assert by_variant["packed"]["rows"] < by_variant["padded"]["rows"] == 8
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["mfu"] == pytest.approx(r["model_tflops"] / 1.0)


def test_datasheet_peak_by_device_kind():
    assert bench.datasheet_peak("NVIDIA H100 80GB HBM3", "bf16") == 989.0
    assert bench.datasheet_peak("NVIDIA H100 PCIe", "bf16") == 756.0  # the more specific key comes first
    assert bench.datasheet_peak("TPU v5 lite", "fp16") == 197.0
    assert bench.datasheet_peak("NVIDIA H100 80GB HBM3", "fp32") is None
    assert bench.datasheet_peak("cpu", "bf16") is None
