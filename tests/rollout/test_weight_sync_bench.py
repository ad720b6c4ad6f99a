"""The sync-vs-size benchmark's model shapes and fit (no server: the benchmark itself starts them)."""
from __future__ import annotations

import pytest

from jaxrl_llm.benchmarks.cpu import weight_sync


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


def test_peak_memory_of_the_15b_shape_matches_the_oom_killed_run_and_is_refused_in_one_line():
    # The 1.5B run was OOM-killed at ~19 GiB: learner 7.4 + server 5.6 + /dev/shm 5.8 GiB (by hand below).
    cfg = weight_sync.qwen25_config("qwen2.5-1.5b", "bfloat16")
    need = weight_sync.peak_memory(cfg, "bfloat16", "float32")
    count, gib = 1_543_714_304, 2 ** 30
    assert need.learner == int(1.2 * 4 * count + 0.5 * gib) and need.learner / gib == pytest.approx(7.4, abs=0.05)
    assert need.server == 2 * count + gib + int(1.7 * gib) and need.server / gib == pytest.approx(5.6, abs=0.05)
    assert need.staged == 4 * count and need.staged / gib == pytest.approx(5.75, abs=0.01)
    assert need.refusal("qwen2.5-1.5b", 20 * gib) is None
    line = need.refusal("qwen2.5-1.5b", 16 * gib)
    assert line == ("qwen2.5-1.5b: refused, estimated peak 18.7 GiB (learner 7.4 + server 5.6 + /dev/shm 5.8) "
                    "> MemAvailable 16.0 GiB")


def test_a_model_that_does_not_fit_is_refused_before_anything_is_built(monkeypatch, capsys):
    monkeypatch.setattr(weight_sync, "mem_available_bytes", lambda: 2 ** 30)
    monkeypatch.setattr(weight_sync, "build_model", lambda *a: pytest.fail("built a model that does not fit"))
    out = weight_sync.main(["--models", "qwen2.5-0.5b", "--dtype", "bfloat16"])
    assert out["results"] == [] and len(out["skipped"]) == 1
    assert out["skipped"][0].startswith("qwen2.5-0.5b: refused, estimated peak ")
    assert out["skipped"][0].endswith("> MemAvailable 1.0 GiB") and out["skipped"][0] in capsys.readouterr().out


def test_critical_path_is_verify_in_line_and_the_wait_when_overlapped():
    from jaxrl_llm.rollout import WeightSyncReport

    report = WeightSyncReport(3, "/dev/shm/x", export_s=0.25, reload_s=0.5, verify_s=0.125, probe_max_abs_diff=0.0)
    inline = weight_sync.PushAndStep(False, report, wait_s=0.0, step_s=2.0, step_tokens=10)
    overlapped = weight_sync.PushAndStep(True, report, wait_s=0.0625, step_s=2.0, step_tokens=10)
    assert inline.critical_s == 0.875 and overlapped.critical_s == 0.8125
    assert inline.cycle_s == 2.875 and overlapped.cycle_s == 2.75  # the step's 2 s already holds the wait
