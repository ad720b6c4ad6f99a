"""Per-step curves of several seeds of a run, and their figure with the seed spread.

An experiment that trains each variant from several seeds reads each run's
`groups.jsonl` into per-step curves (`per_step_lengths`) and draws them with
`plot_seed_bands`: the mean over seeds, its 95% Student-t band
(`reports.stats.interval`) and every seed as points.
"""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from jaxrl_llm.reports import stats

COLORS = ("tab:red", "tab:blue", "tab:green", "tab:purple", "tab:orange", "tab:brown")


def per_step_lengths(groups: Sequence[Mapping]) -> dict[str, list[float]]:
    """Per step of one run: mean length of correct and of incorrect responses (nan when a
    step has none), reward and the number of incorrect responses."""
    out = {"length_correct": [], "length_incorrect": [], "reward": [], "n_incorrect": []}
    for g in groups:
        lengths = np.asarray(g["lengths"], float).reshape(-1)
        rewards = np.asarray(g["rewards"], float).reshape(-1)
        right = rewards >= 1.0
        out["length_correct"].append(float(lengths[right].mean()) if right.any() else float("nan"))
        out["length_incorrect"].append(float(lengths[~right].mean()) if (~right).any() else float("nan"))
        out["reward"].append(float(rewards.mean()))
        out["n_incorrect"].append(int((~right).sum()))
    return out


def change(curve: Sequence[float]) -> float:
    """Last minus first finite value of a curve (nan with fewer than two)."""
    finite = [v for v in curve if np.isfinite(v)]
    return finite[-1] - finite[0] if len(finite) >= 2 else float("nan")


def seed_band(values: np.ndarray, limits: tuple[float, float] | None = None) -> tuple[np.ndarray, ...]:
    """Per step (column of values [seeds, steps]): the mean over seeds and its 95% Student-t
    band, clipped to ``limits`` (a value's known range: over few seeds the t-band of a bounded
    value such as a 0/1 reward can pass its bound, which no seed could)."""
    ivs = [stats.interval(values[:, t]) for t in range(values.shape[1])]
    mean, low, high = (np.array([getattr(i, k) for i in ivs], float) for k in ("mean", "low", "high"))
    if limits is not None:
        low, high = np.clip(low, *limits), np.clip(high, *limits)
    return mean, low, high


def reward_length_limits(max_tokens: int) -> dict[str, tuple[float, float]]:
    """``plot_seed_bands`` limits of a 0/1 reward and of response lengths capped at ``max_tokens``."""
    return {"reward": (0.0, 1.0), "length_correct": (0.0, float(max_tokens)),
            "length_incorrect": (0.0, float(max_tokens))}


def plot_seed_bands(curves: Mapping[str, Sequence[Mapping[str, Sequence[float]]]], keys: Sequence[str],
                    path: Path | str, *, title: str, limits: Mapping[str, tuple[float, float]] | None = None) -> None:
    """One panel per key; per variant the mean over seeds, its 95% band (>= 2 seeds; clipped to
    ``limits[key]`` where given, see ``seed_band``) and each seed's values as points."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(keys), figsize=(4.4 * len(keys), 3.6))
    for ax, key in zip(np.atleast_1d(axes), keys):
        for color, (variant, seeds) in zip(COLORS, curves.items()):
            values = np.array([s[key] for s in seeds], float)  # [seeds, steps]
            steps = np.arange(1, values.shape[1] + 1)
            mean, low, high = seed_band(values, (limits or {}).get(key))
            ax.plot(steps, mean, color=color, label=f"{variant} (n = {len(seeds)})")
            if len(seeds) > 1:
                ax.fill_between(steps, low, high, color=color, alpha=0.2)
            for row in values:
                ax.scatter(steps, row, color=color, s=6, alpha=0.5)
        ax.set_title(key, fontsize=9)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))  # whole steps only
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
