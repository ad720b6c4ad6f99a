"""`make bench-model` on a tiny Llama: shape parsing, and one timed shape per dtype whose JAX
loss equals transformers' loss on the same weights (the two engines compute the same thing)."""
from __future__ import annotations

import argparse

import numpy as np
import pytest

from jaxrl_llm.benchmarks import model as bench
from tests.models.hf_reference import hf_model, our_config_and_params


def test_parse_shapes():
    assert bench.parse_shapes("4x128,2x2048") == [(4, 128), (2, 2048)]
    for bad in ("4", "4x1", "0x128", "ax128"):
        with pytest.raises(SystemExit, match=bad):
            bench.parse_shapes(bad)


@pytest.mark.parametrize("dtype, tol, profile", [("float32", 1e-5, True),
                                                 pytest.param("bfloat16", 2e-2, False, marks=pytest.mark.slow)])
def test_one_shape_times_both_engines_on_the_same_loss(dtype, tol, profile, capsys):
    model = hf_model("llama_tied")
    cfg, params = our_config_and_params(model)
    cfg, params, torch_model = bench.with_dtype(cfg, params, model.train(), dtype)
    args = argparse.Namespace(warmup=0, iters=1, chunk_size=8, skip_torch=False, torch_threads=[1], profile=profile,
                              remat="auto")
    throughput = bench.bench_shape(cfg, params, torch_model, 2, 24, args)
    assert set(throughput) == {"jax", "torch-1"} and min(throughput.values()) > 0
    out = capsys.readouterr().out
    losses = [float(line.rsplit("loss", 1)[1]) for line in out.splitlines() if " loss " in line]
    assert len(losses) == 2 and losses[0] == pytest.approx(losses[1], rel=tol)
    assert losses[0] == pytest.approx(np.log(cfg.vocab_size), rel=0.5)  # random tokens: near-uniform
    assert out.count("phase ") == (4 if profile else 0)


def test_remat_auto_threshold():
    gib = 2**30
    assert not bench.needs_remat(1 * gib, 24 * gib)  # 4x128 float32: 1.1 GiB saved
    assert bench.needs_remat(11 * gib, 24 * gib)  # 8x512: 11.3 GiB, the torch model beside it
    assert not bench.needs_remat(11 * gib, 128 * gib)
