"""plot_runs / plot_main: PNG output, panels, lines, labels, smoothing."""

import struct

import numpy as np
import pytest

from jaxrl_llm.train.config import Config, replace_values
from jaxrl_llm.train.run.metrics import MetricsWriter
from jaxrl_llm.train.run.plots import ema_smooth, plot_main, plot_runs

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _png_size(path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def _make_run(path, name, steps, with_kl):
    cfg = replace_values(Config(), {"name": name})
    with MetricsWriter(path, tensorboard=False, config=cfg) as writer:
        for step in range(1, steps + 1):
            metrics = {"reward/mean": step / steps, "loss": 1.0 / step}
            if with_kl:
                metrics["kl"] = 0.01 * step
            writer.write(step, metrics)


@pytest.fixture
def two_runs(tmp_path):
    a, b = tmp_path / "run_a", tmp_path / "run_b"
    _make_run(a, "grpo", 20, with_kl=True)
    _make_run(b, "dr_grpo", 15, with_kl=False)
    return a, b


def test_ema_smooth_matches_hand_computed_values():
    # weight 0.5 on [1, 0, 1]: raw EMA 0.5, 0.25, 0.625; debias by 1 - 0.5^n -> 1, 1/3, 5/7
    np.testing.assert_allclose(ema_smooth([1.0, 0.0, 1.0], 0.5), [1.0, 1 / 3, 5 / 7])
    # a NaN is skipped: the smoothed value carries over
    np.testing.assert_allclose(ema_smooth([float("nan"), 2.0, float("nan")], 0.5), [np.nan, 2.0, 2.0])
    np.testing.assert_array_equal(ema_smooth([3.0, 4.0], 0.0), [3.0, 4.0])
    with pytest.raises(ValueError, match=r"smoothing = 1.0 is invalid"):
        ema_smooth([1.0], 1.0)


def test_plot_runs_writes_png_with_one_panel_per_metric(two_runs, tmp_path):
    out = tmp_path / "plots" / "compare.png"
    fig = plot_runs(two_runs, ["reward/mean", "loss", "kl"], out, smoothing=0.6)
    width, height = _png_size(out)
    assert (width, height) == (3 * 480, 340)  # 4.8 x 3.4 inches per panel at 100 dpi
    assert out.stat().st_size > 10_000

    assert [ax.get_title() for ax in fig.axes] == ["reward/mean", "loss", "kl"]
    # smoothing > 0: a faint raw line and a smoothed line per run; kl exists only in run_a
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 4, 2]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["grpo", "dr_grpo"]

    reward_lines = fig.axes[0].get_lines()
    raw_b, smooth_b = reward_lines[2], reward_lines[3]
    np.testing.assert_array_equal(raw_b.get_xdata(), np.arange(1, 16))
    np.testing.assert_allclose(raw_b.get_ydata(), np.arange(1, 16) / 15)
    # the smoothed line's first point is the first raw point (debiased EMA)
    assert smooth_b.get_ydata()[0] == pytest.approx(1 / 15)


def test_plot_all_metrics_without_smoothing_and_grid_layout(two_runs, tmp_path):
    out = tmp_path / "all.png"
    fig = plot_runs(two_runs, None, out, ncols=2)
    assert [ax.get_title() for ax in fig.axes] == ["kl", "loss", "reward/mean"]
    assert [len(ax.get_lines()) for ax in fig.axes] == [1, 2, 2]
    assert _png_size(out) == (2 * 480, 2 * 340)  # 2 x 2 grid, the fourth panel removed


def test_same_names_are_disambiguated_by_directory(tmp_path):
    _make_run(tmp_path / "seed0", "grpo", 3, with_kl=False)
    _make_run(tmp_path / "seed1", "grpo", 3, with_kl=False)
    fig = plot_runs([tmp_path / "seed0", tmp_path / "seed1"], ["loss"], tmp_path / "s.png")
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["grpo (seed0)", "grpo (seed1)"]


def test_unknown_metric_and_missing_run_are_clear_errors(two_runs, tmp_path):
    with pytest.raises(ValueError, match=r"metric 'reward' is in none of the runs; available: kl, loss, reward/mean; did you mean 'reward/mean'"):
        plot_runs(two_runs, ["reward"], tmp_path / "x.png")
    with pytest.raises(FileNotFoundError, match=r"has no metrics.jsonl"):
        plot_runs([tmp_path / "nothing"], ["loss"], tmp_path / "x.png")


def test_plot_main_command_line(two_runs, tmp_path, capsys):
    out = tmp_path / "cli.png"
    argv = [str(two_runs[0]), str(two_runs[1]), "--metrics", "reward/mean,loss", "--out", str(out), "--smoothing", "0.3"]
    assert plot_main(argv) == 0
    assert _png_size(out) == (2 * 480, 340)
    assert "2 panels, 2 runs" in capsys.readouterr().out
    assert plot_main([str(two_runs[0]), "--list"]) == 0
    assert capsys.readouterr().out.split() == ["kl", "loss", "reward/mean"]
