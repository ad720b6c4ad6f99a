"""The sync-vs-size benchmark's model shapes and fit (no server: the benchmark itself starts them)."""
from __future__ import annotations

import pytest

from jaxrl_llm.benchmarks import weight_sync


def test_qwen25_shapes_have_the_published_parameter_counts():
    # Parameter counts of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B (tied embeddings, q/k/v biases).
    assert weight_sync.qwen25_config("qwen2.5-0.5b", "bfloat16").num_params() == 494_032_768
    assert weight_sync.qwen25_config("qwen2.5-1.5b", "bfloat16").num_params() == 1_543_714_304


def test_per_gb_fit_recovers_a_line_by_hand():
    intercept, slope = weight_sync.fit_per_gb([0.25, 1.0, 3.0], [0.1 + 2 * 0.25, 0.1 + 2 * 1.0, 0.1 + 2 * 3.0])
    assert intercept == pytest.approx(0.1) and slope == pytest.approx(2.0)


def test_unknown_model_is_refused_naming_the_valid_ones(capsys):
    with pytest.raises(SystemExit):
        weight_sync.main(["--models", "qwen2.5-7b"])
    err = capsys.readouterr().err
    assert "qwen2.5-7b" in err and "'qwen2.5-1.5b'" in err
