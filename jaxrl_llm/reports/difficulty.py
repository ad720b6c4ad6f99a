"""Difficulty bias, analytic and measured on a real run's groups.

For binary rewards a group of G answers with success rate p = k/G has
centred advantages 1 - p (k times) and -p (G - k times), so the per-prompt
weight E_g|A_g| is 2p(1-p) without std normalisation (Dr. GRPO) and
2p(1-p) / std with it (GRPO). With the sample std (ddof = 1, what GRPO and
our "grpo" recipe use), std = sqrt(G/(G-1) p(1-p)), so the std-normalised
weight is 2 sqrt((G-1)/G) sqrt(p(1-p)): it falls off far less towards p -> 0
and p -> 1, i.e. too-hard and too-easy prompts are up-weighted relative to
p = 1/2 (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1).

The measured side takes every group a run logged (groups.jsonl), applies the
recipes' own advantage functions, and differentiates the real loss
(`core.recipe_loss`) per step to get each group's share of the gradient
weight, and how std normalisation changes that share (ratio of shares).
Both recipes compared use the same aggregation (seq-mean-token-mean),
so the difference is the std normalisation alone.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core

# The two estimators under test, with everything else equal (GRPO's aggregation and loss).
RECIPES = {
    "std (GRPO)": core.get_recipe("grpo"),
    "no std (Dr. GRPO advantage)": core.get_recipe("grpo", advantage_fn=core.GroupAdvantage(core.dr_grpo_advantages)),
}


def analytic_weight(p, group_size: int, *, std_normalised: bool, ddof: int = 1) -> np.ndarray:
    """E_g|A_g| at success rate p for a group of `group_size` binary rewards (0 at p in {0, 1})."""
    p = np.asarray(p, np.float64)
    no_std = 2.0 * p * (1.0 - p)
    if not std_normalised:
        return no_std
    std = np.sqrt(group_size / (group_size - ddof) * p * (1.0 - p))
    return np.where(std > 0, no_std / np.where(std > 0, std, 1.0), 0.0)


def group_weights(recipe: core.Recipe, rewards: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For one step's groups: ([P] mean |A| per group from the recipe's advantage function,
    [P] the group's share of sum_t |dL/d log pi_t| of the recipe's loss at pi = pi_old)."""
    width = int(lengths.max())
    mask = (np.arange(width)[None, :] < lengths.reshape(-1, 1)).astype(np.float32)
    old = jnp.full(mask.shape, -1.0, jnp.float32)
    batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards, jnp.float32), jnp.asarray(mask),
                                                               old, old))
    grad = jax.grad(lambda lp: core.recipe_loss(recipe, lp, batch)[0])(old)
    push = np.asarray(jnp.sum(jnp.abs(grad), axis=1)).reshape(rewards.shape).sum(axis=1)
    per_response_adv = np.asarray(jnp.sum(batch.advantages * jnp.asarray(mask), axis=1)) / np.maximum(
        lengths.reshape(-1), 1)
    mean_abs_adv = np.abs(per_response_adv).reshape(rewards.shape).mean(axis=1)
    total = push.sum()
    return mean_abs_adv, push / total if total > 0 else np.zeros_like(push)


def measure(records: Sequence[dict]) -> dict:
    """Per success-rate level k/G over all logged groups: counts, analytic and measured
    weights, and the mean gradient share of a group at that level, per estimator."""
    group_size = len(records[0]["rewards"][0])
    levels = np.arange(group_size + 1) / group_size
    success, adv, share = [], {n: [] for n in RECIPES}, {n: [] for n in RECIPES}
    for record in records:
        rewards = (np.asarray(record["rewards"], np.float32) >= 1.0).astype(np.float32)
        lengths = np.maximum(np.asarray(record["lengths"], np.int32), 1)
        success.append(rewards.mean(axis=1))
        for name, recipe in RECIPES.items():
            a, s = group_weights(recipe, rewards, lengths)
            adv[name].append(a)
            share[name].append(s)
    success = np.concatenate(success)
    k = np.rint(success * group_size).astype(int)
    rows = []
    for level in range(group_size + 1):
        sel = k == level
        row = {"p": float(levels[level]), "groups": int(sel.sum())}
        for name, std in (("std (GRPO)", True), ("no std (Dr. GRPO advantage)", False)):
            short = "std" if std else "no_std"
            row[f"analytic {short}"] = float(analytic_weight(levels[level], group_size, std_normalised=std))
            values = np.concatenate(adv[name])[sel]
            row[f"measured {short}"] = float(values.mean()) if sel.any() else float("nan")
            row[f"grad share {short}"] = float(np.concatenate(share[name])[sel].mean()) if sel.any() else float("nan")
        # How std normalisation re-weights a group against the others of its own step.
        std_share, no_share = (np.concatenate(share[n])[sel] for n in RECIPES)
        row["share ratio std/no_std"] = (float(np.mean(std_share[no_share > 0] / no_share[no_share > 0]))
                                         if (no_share > 0).any() else float("nan"))
        rows.append(row)
    return {"group_size": group_size, "rows": rows, "success": success,
            "mean_abs_adv": {n: np.concatenate(v) for n, v in adv.items()}}


def plot(result: dict, path: Path, *, title: str = "Difficulty bias") -> None:
    from jaxrl_llm.train.run.plots import new_figure, save_png

    g, rows = result["group_size"], result["rows"]
    fig = new_figure((15, 4.2))
    ax1, ax2, ax3 = fig.subplots(1, 3)
    grid = np.linspace(0, 1, 201)
    for std, color, label in ((True, "C3", "std (GRPO)"), (False, "C0", "no std (Dr. GRPO)")):
        ax1.plot(grid, analytic_weight(grid, g, std_normalised=std), color=color, label=f"analytic {label}")
    rng = np.random.default_rng(0)
    jitter = rng.uniform(-0.012, 0.012, size=result["success"].shape)
    for (name, values), color, marker in zip(result["mean_abs_adv"].items(), ("C3", "C0"), ("o", "s")):
        ax1.scatter(result["success"] + jitter, values, s=14, alpha=0.5, color=color, marker=marker,
                    label=f"measured groups: {name}")
    ax1.set_xlabel("group success rate p")
    ax1.set_ylabel("per-prompt weight E|A|")
    ax1.set_title(f"weight vs success rate (G = {g})", fontsize=10)
    ax1.legend(fontsize=7)

    inner = [r for r in rows if 0 < r["p"] < 1 and r["groups"]]
    ax2.bar([r["p"] for r in inner], [r["share ratio std/no_std"] for r in inner], width=0.6 / g, color="C3")
    ax2.axhline(1.0, color="k", lw=0.8)
    ax2.set_xlabel("group success rate p")
    ax2.set_ylabel("gradient share with std / without")
    ax2.set_title("measured from the loss gradient, real groups:\n>1 = std normalisation up-weights the group",
                  fontsize=10)

    ax3.bar([r["p"] for r in rows], [r["groups"] for r in rows], width=0.8 / g, color="C7")
    ax3.set_xlabel("group success rate p")
    ax3.set_ylabel("groups in the run(s)")
    ax3.set_title("where the run's groups fall (p = 0 or 1: no signal)", fontsize=10)
    fig.suptitle(title)
    save_png(fig, path)
