"""Bias report: what each recipe's aggregation and advantage imply, measured.

For a sampled batch (P prompts x G responses with binary rewards, wrong
answers longer than right ones, as observed in RL on LLMs) this computes,
for each recipe, the per-token gradient weight  -dL/d log pi_it  by
differentiating the recipe's real loss (`core.prepare_step_batch` +
`core.recipe_loss`) at pi = pi_old, and compares it with the closed form
(`core.implied_token_weight`; docs/objectives.md#length-bias). It also draws the difficulty
weight that std normalisation implies against the group success rate
(Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1).

Outputs: a printed table, bias_table.md / bias_table.csv, and two PNGs
(length_bias.png, difficulty_bias.png) in the output directory.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core

DEFAULT_RECIPES = ("grpo", "dr_grpo", "dapo", "olmo3", "rloo")


@dataclasses.dataclass(frozen=True)
class SampledBatch:
    rewards: np.ndarray  # [P, G] in {0, 1}
    lengths: np.ndarray  # [N]
    max_length: int

    @property
    def mask(self) -> np.ndarray:
        return (np.arange(self.max_length)[None, :] < self.lengths[:, None]).astype(np.float32)


def sample_batch(num_prompts: int = 32, group_size: int = 8, max_length: int = 512, seed: int = 0) -> SampledBatch:
    """Binary rewards with per-prompt success rates p ~ Beta(0.6, 0.6) (many
    too-easy and too-hard prompts), correct lengths ~ logNormal around 120
    tokens, incorrect around 260, clipped to [1, max_length]."""
    rng = np.random.default_rng(seed)
    p = rng.beta(0.6, 0.6, size=(num_prompts, 1))
    rewards = (rng.random((num_prompts, group_size)) < p).astype(np.float32)
    median = np.where(rewards.reshape(-1) > 0, 120.0, 260.0)
    lengths = np.clip(np.round(median * rng.lognormal(0.0, 0.45, size=median.shape)), 1, max_length)
    return SampledBatch(rewards, lengths.astype(np.int32), max_length)


def measured_token_weights(recipe_name: str, batch: SampledBatch) -> tuple[np.ndarray, np.ndarray]:
    """([N] per-token weight -dL/d log pi_it of each response (mean over its
    tokens), from the gradient of the recipe's loss at log pi = log pi_old,
    [N] the response's advantage A_i)."""
    overrides = {"constant_length": batch.max_length} if recipe_name == "dr_grpo" else {}
    recipe = core.get_recipe(recipe_name, **overrides)
    mask = jnp.asarray(batch.mask)
    old_logp = jnp.full(mask.shape, -1.0, jnp.float32)
    step, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(batch.rewards), mask, old_logp, old_logp))
    grad = jax.grad(lambda lp: core.recipe_loss(recipe, lp, step)[0])(old_logp)
    per_response = -np.asarray(jnp.sum(grad * mask, axis=1))
    advantages = np.asarray(jnp.sum(step.advantages * mask, axis=1)) / np.maximum(batch.lengths, 1)
    return per_response / np.maximum(batch.lengths, 1), advantages


def length_exponent(lengths: np.ndarray, weights: np.ndarray, advantages: np.ndarray) -> float:
    """Slope of log|w/A| against log L over responses with A != 0: the per-token
    weight per unit advantage scales as L^slope; -1 is GRPO's 1/L length bias,
    0 means the weight does not depend on the length."""
    keep = (np.abs(advantages) > 1e-6) & (np.abs(weights) > 0)
    if keep.sum() < 2:
        return float("nan")
    unit = np.abs(weights[keep] / advantages[keep])
    return float(np.polyfit(np.log(lengths[keep]), np.log(unit), 1)[0])


def summarise(recipe_name: str, batch: SampledBatch, weights: np.ndarray, advantages: np.ndarray) -> dict:
    correct = batch.rewards.reshape(-1) > 0
    short = batch.lengths <= np.median(batch.lengths)
    wrong = ~correct & (np.abs(weights) > 0)

    def mean_abs(sel):
        return float(np.mean(np.abs(weights[sel]))) if sel.any() else float("nan")

    return {
        "recipe": recipe_name,
        "aggregation": core.get_recipe(recipe_name).aggregation,
        "length_exponent": length_exponent(batch.lengths.astype(np.float64), weights, advantages),
        "w_correct_short": mean_abs(correct & short),
        "w_correct_long": mean_abs(correct & ~short),
        "w_wrong_short": mean_abs(wrong & short),
        "w_wrong_long": mean_abs(wrong & ~short),
        # total push on a wrong response per unit advantage: sum_t |w| = L |w|
        "wrong_long_over_short_total_penalty": (
            float(np.mean((batch.lengths * np.abs(weights))[wrong & ~short])
                  / np.mean((batch.lengths * np.abs(weights))[wrong & short]))
            if (wrong & short).any() and (wrong & ~short).any() else float("nan")),
    }


def format_table(rows: list[dict]) -> str:
    header = ["recipe", "aggregation", "length exponent", "|w| correct short", "|w| correct long",
              "|w| wrong short", "|w| wrong long", "wrong long/short total"]
    keys = ["recipe", "aggregation", "length_exponent", "w_correct_short", "w_correct_long", "w_wrong_short",
            "w_wrong_long", "wrong_long_over_short_total_penalty"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row[k] if isinstance(row[k], str) else f"{row[k]:.3g}" for k in keys]
        cells[2] = f"{row['length_exponent']:+.2f}"
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_length_bias(batch: SampledBatch, measured: dict[str, tuple[np.ndarray, np.ndarray]], path: str) -> None:
    """One panel per recipe: per-token weight per unit advantage |w_it| = |w_it A_i / A_i|
    against L_i on log-log axes (a slope of -1 is the 1/L length bias), correct and
    incorrect responses coloured, with the closed form (docs/objectives.md#length-bias) dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(measured)
    fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.4), sharey=True)
    correct = batch.rewards.reshape(-1) > 0
    n = batch.lengths.size
    grid = np.arange(1, batch.max_length + 1, dtype=np.float32)
    for ax, name in zip(np.atleast_1d(axes), names):
        weights, advantages = measured[name]
        keep = (np.abs(advantages) > 1e-6) & (np.abs(weights) > 0)
        unit = np.abs(weights[keep] / advantages[keep])
        lengths, is_correct = batch.lengths[keep], correct[keep]
        ax.scatter(lengths[is_correct], unit[is_correct], s=9, c="tab:green", label="correct")
        ax.scatter(lengths[~is_correct], unit[~is_correct], s=9, c="tab:red", label="incorrect")
        mode = core.get_recipe(name).aggregation
        curve = np.asarray(core.implied_token_weight(
            jnp.asarray(grid), jnp.ones_like(jnp.asarray(grid)), mode, num_responses=n,
            total_tokens=float(np.sum(batch.mask * keep.reshape(-1, 1).astype(np.float32)))
            if mode == "token_mean" else None, constant_length=batch.max_length))
        ax.plot(grid, curve, "k--", lw=1, label="closed form")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"{name}: {mode}", fontsize=9)
        ax.set_xlabel("response length L_i (tokens)")
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("per-token weight per unit advantage |w_it|")
    first.legend(fontsize=7)
    fig.suptitle("Length bias: GRPO's per-token weight falls as 1/L; the others do not depend on L", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_difficulty_bias(batch: SampledBatch, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = np.linspace(0, 1, 201)
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(p, np.asarray(core.difficulty_weight(jnp.asarray(p), std_normalised=False)), label="no std (Dr. GRPO): 2p(1-p)")
    ax.plot(p, np.asarray(core.difficulty_weight(jnp.asarray(p), std_normalised=True)), label="std (GRPO): 2 sqrt(p(1-p))")
    success = batch.rewards.mean(axis=1)
    for name, fn, marker in (("GRPO groups (ddof=0)", lambda r: core.grpo_advantages(r, ddof=0), "o"),
                             ("Dr. GRPO groups", core.dr_grpo_advantages, "s")):
        adv = np.asarray(fn(jnp.asarray(batch.rewards)))
        ax.scatter(success, np.abs(adv).mean(axis=1), marker=marker, s=18, alpha=0.7, label=f"measured: {name}")
    ax.set_xlabel("group success rate p")
    ax.set_ylabel("per-prompt weight E|A|")
    ax.set_title("Difficulty bias of std normalisation", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else float("nan")


def batch_from_groups(records: list[dict], max_length: int) -> SampledBatch:
    """The groups of a real run (`groups.jsonl` records, see train.metrics.GroupLog)
    pooled into one batch: rewards [sum of P over steps, G] and their lengths."""
    if not records:
        raise ValueError("no groups to pool; valid: the records of a run's groups.jsonl")
    rewards = np.concatenate([np.asarray(r["rewards"], np.float32) for r in records])
    lengths = np.concatenate([np.asarray(r["lengths"], np.int32).reshape(-1) for r in records])
    return SampledBatch((rewards >= 1.0).astype(np.float32), np.clip(lengths, 1, max_length), int(max_length))


def run(out_dir: str, *, recipes=DEFAULT_RECIPES, seed: int = 0, batch: SampledBatch | None = None) -> list[dict]:
    """The report on `batch` (default: `sample_batch(seed=seed)`, a synthetic one)."""
    os.makedirs(out_dir, exist_ok=True)
    batch = batch if batch is not None else sample_batch(seed=seed)
    measured = {name: measured_token_weights(name, batch) for name in recipes}
    rows = [summarise(name, batch, *measured[name]) for name in recipes]
    table = format_table(rows)
    with open(os.path.join(out_dir, "bias_table.md"), "w") as f:
        f.write(table + "\n")
    with open(os.path.join(out_dir, "bias_table.csv"), "w") as f:
        f.write(",".join(rows[0]) + "\n")
        for row in rows:
            f.write(",".join(str(v) for v in row.values()) + "\n")
    plot_length_bias(batch, measured, os.path.join(out_dir, "length_bias.png"))
    plot_difficulty_bias(batch, os.path.join(out_dir, "difficulty_bias.png"))
    print(f"Batch: {batch.rewards.shape[0]} prompts x {batch.rewards.shape[1]} responses, "
          f"mean length correct {_mean(batch.lengths[batch.rewards.reshape(-1) > 0]):.0f}, "
          f"incorrect {_mean(batch.lengths[batch.rewards.reshape(-1) == 0]):.0f} tokens, L_max {batch.max_length}")
    print(table)
    print("length exponent: slope of log|w/A| vs log L (-1 = per-token weight ~ 1/L, 0 = independent of L);\n"
          "|w|: mean per-token |w_it A_i|; last column: mean total push sum_t |w A| on long vs short wrong answers.")
    print(f"wrote {out_dir}/bias_table.md, bias_table.csv, length_bias.png, difficulty_bias.png")
    return rows
