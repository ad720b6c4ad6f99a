"""PNG comparisons of runs: one panel per metric, one line per run.

    plot_runs(["runs/grpo", "runs/dr_grpo"], ["reward/mean", "response_length/mean"],
              "compare.png", smoothing=0.6)

or from the command line (cli.py forwards to `plot_main`):

    jaxrl plot runs/grpo runs/dr_grpo --metrics reward/mean,response_length/mean --out compare.png

Lines are labelled with the run's name from run_info.json (the config's
name), and the figure's top-right footer names the runs' git commit and JAX
version (also from run_info.json). Lines fall back to the directory name
when there is no run_info.json. The figure is drawn with the Agg canvas
directly, so no display and no global pyplot state are involved.
"""

from __future__ import annotations

import argparse
import difflib
import math
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from jaxrl_llm.train.run.metrics import METRICS_FILE, read_metrics

from jaxrl_llm.train.run.provenance import read_run_info

_NOT_METRICS = {"step", "time"}


def ema_smooth(values: Sequence[float], weight: float) -> np.ndarray:
    """TensorBoard-style debiased exponential moving average.

    s_t = weight * s_{t-1} + (1 - weight) * x_t with s_0 = 0, reported as
    s_t / (1 - weight^n_t) where n_t counts the finite values seen so far, so
    the first points are not pulled towards 0. Non-finite values are skipped
    (the previous smoothed value is repeated; NaN before the first finite one).
    """
    if not 0.0 <= weight < 1.0:
        raise ValueError(f"smoothing = {weight!r} is invalid; valid: 0 <= smoothing < 1")
    out = np.full(len(values), np.nan)
    acc, seen = 0.0, 0
    for i, x in enumerate(values):
        if x is not None and math.isfinite(x):
            acc = weight * acc + (1.0 - weight) * x
            seen += 1
        if seen:
            out[i] = acc / (1.0 - weight**seen)
    return out


def run_label(run_dir: str | os.PathLike) -> str:
    """The name a run goes by in legends: run_info name, else config name, else the directory name."""
    info = read_run_info(run_dir) or {}
    name = info.get("name") or (info.get("config") or {}).get("name")
    return str(name) if name else Path(run_dir).resolve().name


def _labels(run_dirs: Sequence[str | os.PathLike]) -> list[str]:
    labels = [run_label(d) for d in run_dirs]
    # Two runs of the same config (e.g. seeds) need distinct legend entries.
    return [
        f"{lab} ({Path(d).resolve().name})" if labels.count(lab) > 1 else lab for lab, d in zip(labels, run_dirs)
    ]


def new_figure(figsize: tuple[float, float]) -> Figure:
    """A constrained-layout Figure on its own Agg canvas (no pyplot state, no display)."""
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save_png(fig: Figure, path: str | os.PathLike) -> Path:
    """Writes fig as PNG atomically (temporary file + rename), creating the folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=100)
    os.replace(tmp, out)
    return out


def provenance(run_dirs: Sequence[str | os.PathLike]) -> str:
    """The footer "git <commit>[+dirty] | jax <version>" of the runs (from run_info.json),
    so a figure says which code produced its lines; differing values are all listed."""
    infos = [read_run_info(d) or {} for d in run_dirs]
    commits = sorted({(i.get("git_commit") or "?")[:10] + ("+dirty" if i.get("git_dirty") else "")
                      for i in infos if i})
    jax_versions = sorted({(i.get("versions") or {}).get("jax", "?") for i in infos if i})
    if not commits:
        return ""
    return f"git {', '.join(commits)} | jax {', '.join(jax_versions)}"


def _numeric(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _series(records: list[dict[str, Any]], metric: str, x: str) -> tuple[np.ndarray, np.ndarray]:
    pairs = [(r[x], r[metric]) for r in records if _numeric(r.get(metric)) and _numeric(r.get(x))]
    if not pairs:
        return np.zeros(0), np.zeros(0)
    xs, ys = zip(*pairs)
    return np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)


def available_metrics(records_by_run: Sequence[list[dict[str, Any]]]) -> list[str]:
    names = {k for records in records_by_run for r in records for k, v in r.items() if _numeric(v)}
    return sorted(names - _NOT_METRICS)


def plot_runs(
    run_dirs: Sequence[str | os.PathLike],
    metrics: Sequence[str] | None = None,
    out_png: str | os.PathLike = "compare.png",
    *,
    smoothing: float = 0.0,
    x: str = "step",
    title: str | None = None,
    ncols: int = 3,
) -> Figure:
    """Draws one panel per metric with one line per run and writes out_png.

    Args:
      run_dirs: run directories holding metrics.jsonl (and run_info.json for labels).
      metrics: metric names; None plots every numeric metric found.
      smoothing: EMA weight in [0, 1) (see `ema_smooth`); above 0 each run
        gets a faint raw line plus the smoothed line.
      x: the record key on the horizontal axis.
    Returns the Figure (len(fig.axes) == number of metrics).
    """
    if not run_dirs:
        raise ValueError("plot_runs needs at least one run directory")
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing = {smoothing!r} is invalid; valid: 0 <= smoothing < 1")
    records_by_run = []
    for d in run_dirs:
        if not (Path(d) / METRICS_FILE).exists():
            raise FileNotFoundError(f"{os.fspath(d)} has no {METRICS_FILE}; valid: a run directory")
        records_by_run.append(read_metrics(d))
    found = available_metrics(records_by_run)
    metrics = list(metrics) if metrics else found
    for m in metrics:
        if m not in found:
            close = difflib.get_close_matches(m, found, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"metric {m!r} is in none of the runs; available: {', '.join(found)}{hint}")
    if not metrics:
        raise ValueError(f"the runs {[os.fspath(d) for d in run_dirs]} have no numeric metrics to plot")

    ncols = max(1, min(ncols, len(metrics)))
    nrows = math.ceil(len(metrics) / ncols)
    fig = new_figure((4.8 * ncols, 3.4 * nrows))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(metrics):]:
        fig.delaxes(ax)

    labels = _labels(run_dirs)
    colors = [f"C{i % 10}" for i in range(len(run_dirs))]
    handles = {}
    for ax, metric in zip(axes, metrics):
        for records, label, color in zip(records_by_run, labels, colors):
            xs, ys = _series(records, metric, x)
            if xs.size == 0:
                continue
            if smoothing > 0:
                ax.plot(xs, ys, color=color, alpha=0.25, linewidth=0.8)
                ys = ema_smooth(ys, smoothing)
            (line,) = ax.plot(xs, ys, color=color, linewidth=1.5, label=label)
            handles.setdefault(label, line)
        ax.set_title(metric, fontsize=10)
        ax.set_xlabel(x)
        ax.grid(True, alpha=0.3)
    fig.legend(list(handles.values()), list(handles.keys()), loc="outside lower center", ncols=min(4, len(handles)))
    if title:
        fig.suptitle(title)
    footer = provenance(run_dirs)
    if footer:
        fig.text(0.995, 0.995, footer, ha="right", va="top", fontsize=6, color="0.4")

    save_png(fig, out_png)
    return fig


def plot_pass_at_k(run_dirs: Sequence[str | os.PathLike], out_png: str | os.PathLike) -> Figure:
    """One panel per run: the held-out pass@k curve (k = 1..n) of each evaluated step in its
    eval.jsonl (written with task.eval_every > 0), later steps darker."""
    panels = []
    for d in run_dirs:
        path = Path(d) / "eval.jsonl"
        records = [r for r in read_metrics(path) if "pass_at_k" in r] if path.exists() else []
        if not records:
            raise FileNotFoundError(f"{os.fspath(d)} has no eval.jsonl records with a pass@k curve; valid: a run "
                                    "trained with task.eval_every > 0")
        panels.append(records)
    fig = new_figure((4.8 * len(run_dirs), 3.4))
    for ax, records, label in zip(fig.subplots(1, len(run_dirs), squeeze=False).ravel(), panels, _labels(run_dirs)):
        for i, r in enumerate(records):
            ks = np.arange(1, len(r["pass_at_k"]) + 1)
            ax.plot(ks, r["pass_at_k"], marker="o", color=str(0.8 - 0.8 * (i + 1) / len(records)),
                    label=f"step {r['step']}")
        ax.set_title(f"{label}: held-out pass@k", fontsize=10)
        ax.set_xlabel("k")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    save_png(fig, out_png)
    return fig


def plot_main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point: `plot RUN_DIR [RUN_DIR ...] [--metrics a,b] [--out F.png] [--smoothing W]`."""
    parser = argparse.ArgumentParser(prog="jaxrl plot", description="Compare runs: one panel per metric.")
    parser.add_argument("run_dirs", nargs="+", help="run directories (with metrics.jsonl)")
    parser.add_argument("--metrics", default="", help="comma-separated metric names (default: all numeric)")
    parser.add_argument("--out", default="compare.png", help="output PNG path")
    parser.add_argument("--smoothing", type=float, default=0.0, help="EMA weight in [0, 1)")
    parser.add_argument("--x", default="step", help="record key for the horizontal axis")
    parser.add_argument("--title", default=None)
    parser.add_argument("--list", action="store_true", help="print the available metrics and exit")
    parser.add_argument("--pass-at-k", action="store_true",
                        help="draw each run's held-out pass@k curves (eval.jsonl) instead of metrics")
    args = parser.parse_args(argv)
    if args.pass_at_k:
        fig = plot_pass_at_k(args.run_dirs, args.out)
        print(f"wrote {args.out} ({len(fig.axes)} panels, {len(args.run_dirs)} runs)")
        return 0
    if args.list:
        print("\n".join(available_metrics([read_metrics(d) for d in args.run_dirs])))
        return 0
    metrics = [m.strip() for m in args.metrics.split(",") if m.strip()] or None
    fig = plot_runs(args.run_dirs, metrics, args.out, smoothing=args.smoothing, x=args.x, title=args.title)
    print(f"wrote {args.out} ({len(fig.axes)} panels, {len(args.run_dirs)} runs)")
    return 0
