"""Experiment 5: the length-bias mechanism on a length-neutral task, through the real learner.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1): when the reward
cannot depend on length, does GRPO's 1/|o_i| normalisation by itself lengthen wrong
answers and shorten right ones, while a constant normaliser (Dr. GRPO) does not and
token-mean (DAPO, Yu et al. 2025, arXiv 2503.14476) sits in between? The closed form
(reports/length_drift.py, docs/objectives.md#length-drift-on-a-length-neutral-task) says: the
stop logit after a wrong answer falls under GRPO, stays put in expectation under a constant
normaliser, and falls ~1/N as much under token-mean; and where the stop decision cannot see
the answer (the shared-stop arms), no split in any mode.

The task: a prompt token, then ONE answer token graded alone (RIGHT = 1, anything else
= 0), then free filler tokens until EOS. The policy: a tiny decoder (models/, 2 layers,
17-token vocabulary) trained from scratch by supervised learning on that format with
P(answer = RIGHT) = 1/2 and a stop probability q0 at every free position, so its stop
probability does not depend on the answer when RL starts. Each arm then trains it
from the same weights with the real learner (train/learn/learner.py Learner: the recipe's
core.prepare_step_batch + core.recipe_loss, AdamW); samples come from the decoder itself
at temperature 1. The answer token is left out of the loss mask, so P(RIGHT) stays near
1/2, every group keeps a mix of right and wrong answers, and only the free part (the
length) is trained: the derivation with a = 0 answer tokens in L. The answer is drawn by
the task (the same draws in every arm of a seed), not sampled by the policy: a first launch of
this size (commit 3dc7373) sampled it from the policy, and P(RIGHT) drifted to 0 through the
shared weights in all four arms of seed 100, which stops all learning (groups of one class). Arms: grpo, dr_grpo, dapo,
and grpo_shared, where the policy conditions on a fixed SLOT token in place of the answer it
gave (reports/length_mechanism.py policy_view), so its stop decision cannot see the answer.
Measured per step: the policy's EOS probability at the free decision points of its own
sampled responses, by class (on-policy; also teacher-forced on fixed filler strings, which
stop being the policy's contexts once its fillers drift), sampled lengths, and the
step's stop-logit force sum_it w_it A_i (1[EOS] - q_it) read off the real step batch, next to
its closed form. The task, the decoder, its sampler and the RL loop are
jaxrl_llm/reports/length_mechanism.py; this file sizes the study, fixes its verdict rule and
reports it.

    python experiments/length_mechanism.py --quick     # 5 seeds x 4 arms x 40 steps, <= 48 tokens
    python experiments/length_mechanism.py --seeds 120,121,122,123,124,125,126,127,128,129 \
        --results experiments/results/length_mechanism.json    # the deciding run: 10 fresh seeds x 4 arms x 300 steps

Writes to runs/experiments/length_mechanism/<quick|full>/: seeds/<seed>.json (every arm's
per-step log, written as each seed finishes; a rerun keeps them), summary.md / .json (per
arm and paired against Dr. GRPO, 95% t-intervals over seeds), per_seed.json, drift.png
(paired split over steps, stop probabilities, sampled length split, force vs closed form),
token_mean.png (token-mean's own drift curve and its onset), run_info.json.
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import sys
import time
from pathlib import Path
from typing import NamedTuple, Sequence

import numpy as np

from jaxrl_llm.reports import length_drift, stats
from jaxrl_llm.reports.length_mechanism import NUM_PROMPTS, MechanismStudy, run_study, study_recipes
from jaxrl_llm.reports.runs import experiment_parser, output_dir, write_summary

NAME = "length_mechanism"
QUICK = dataclasses.replace(MechanismStudy(), seeds=5, steps=40)
SIZES = {"": MechanismStudy(), "quick": QUICK}
DECIDING_SEEDS = tuple(range(120, 130))
# 0 sized the run (time per step) and chose sft_steps = 200 from its q0; 100 showed, in the first launch
# (commit 3dc7373), that the policy's own answers drift to all-wrong and the fixed-filler q leaves the
# policy's contexts, which changed the task (answers drawn by the task) and the statistic (on-policy q).
# 110-119 decided the rule of issue 36 (commit 541db40); the equivalence margins below were written after
# seeing them (issue 51), so they may not count under this rule either.
TUNING_SEEDS = (0, 100, *range(110, 120))
BASELINE = "dr_grpo"  # the constant normaliser every arm is paired with


def get_config(arg: str = "") -> MechanismStudy:
    """ARG = "" (full size) or "quick": the study's settings (not a `jaxrl train` config: the
    study runs its own RL loop, reports/length_mechanism.py)."""
    if arg not in SIZES:
        raise ValueError(f"experiments/length_mechanism.py:{arg} is invalid; valid: one of {tuple(SIZES)}")
    return SIZES[arg]


# ------------------------------------------------------------- the verdict rule (issue 51), fixed before the run
CLAIM = ("GRPO: wrong answers lengthen relative to right ones on a length-neutral task; constant normaliser "
         "(Dr. GRPO): no drift; token-mean (DAPO) in between; stop decision blind to the answer: no split in any "
         "mode (Liu et al. 2025, arXiv 2503.20783)")
WINDOW = 25  # steps: a change is the mean of the last 25 steps minus the mean of the first 25
MARGIN_FRACTION = 0.5
MARGIN_KEYS = {"d split": "equivalence margin d split", "d length split": "equivalence margin d length split"}


class Margins(NamedTuple):
    """The equivalence margins of the arms that predict no effect: d split (a probability) and
    d length split (tokens)."""
    split: float
    length: float
    push_ratio: float  # closed-form token-mean / GRPO push at the design q0


def equivalence_margins(study: MechanismStudy) -> Margins:
    """MARGIN_FRACTION x the smallest non-zero drift the closed form predicts in `study`: token-mean's
    push is R = relative_push(token_mean) / relative_push(seq_mean_token_mean) of GRPO's at the design
    stop probability (reports/length_drift.py; answer_tokens 0, max_tokens - 1 free positions, N =
    NUM_PROMPTS x samples responses), and GRPO can move a split by at most its full range: 1 for
    q_wrong - q_right (a difference of probabilities), max_tokens - 1 free tokens for the length split.
    Depends on the study's settings only, never on a measurement."""
    free = study.max_tokens - 1
    kwargs = dict(answer_tokens=0, max_tokens=free, num_responses=NUM_PROMPTS * study.samples,
                  constant_length=study.max_tokens)
    ratio = (length_drift.relative_push("token_mean", study.stop_prob, **kwargs)
             / length_drift.relative_push("seq_mean_token_mean", study.stop_prob, **kwargs))
    return Margins(MARGIN_FRACTION * ratio, MARGIN_FRACTION * ratio * free, ratio)


_M = equivalence_margins(MechanismStudy())
VERDICT_RULE = (
    "Seeds 120-129, fresh (seeds 0 and 100 chose settings and 110-119 were seen before this rule was written: "
    "none counts); a seed counts when all its arms finished (a run cut short counts its finished seeds); fewer "
    "than 2 seeds: inconclusive. Per seed, d split = change of q_wrong - q_right, the on-policy stop probability "
    "(mean EOS probability at the free decision points of the step's sampled responses) after a wrong minus "
    f"after a right answer, mean of the last {WINDOW} steps minus the first {WINDOW}; d length split = the same "
    "change of the sampled length of wrong minus right responses; paired = an arm's d split minus Dr. GRPO's on "
    "the same seed; 95% Student-t over seeds. "
    "(a) GRPO: reproduced if the paired GRPO - Dr. GRPO interval lies below 0, not reproduced if above 0, else "
    "inconclusive. (b) token-mean in between: reproduced if the paired DAPO - Dr. GRPO interval lies below 0 and "
    "its mean is above GRPO's paired mean; not reproduced if it lies above 0 or its upper end lies below GRPO's "
    "paired mean; else inconclusive. Arms that predict no effect, (c) every *_shared arm (stop decision blind to "
    "the answer) and (d) Dr. GRPO (constant normaliser), by equivalence margins fixed before the run from the "
    f"closed-form force: m = {MARGIN_FRACTION:g} x R x full range, R = token-mean's closed-form push / GRPO's at "
    f"the design q0 (reports/length_drift.py relative_push; {_M.push_ratio:.4f} at the full size), full range 1 "
    f"for d split and max_tokens - 1 for d length split ({_M.split:.4f} and {_M.length:.3f} tokens at the full "
    "size): reproduced (no effect) if the arm's own d split and d length split intervals both lie inside +-m; "
    "not reproduced if either lies wholly outside +-m; else inconclusive (not measured precisely enough). "
    "Overall: not reproduced if any of (a)-(d) is, reproduced if all four are, else inconclusive.")


def equivalence(iv, margin: float) -> str:
    """An arm that predicts no effect, on one interval: "reproduced" inside +-margin, "not reproduced"
    wholly outside it, else "inconclusive" (also with < 2 seeds)."""
    if iv.n < 2 or not np.isfinite(margin):
        return "inconclusive"
    if -margin < iv.low and iv.high < margin:
        return "reproduced"
    return "not reproduced" if iv.low >= margin or iv.high <= -margin else "inconclusive"


def no_effect_reading(numbers: dict, arms: Sequence[str]) -> str:
    """(c)/(d): every arm's d split and d length split by `equivalence` against the stored margins."""
    from jaxrl_llm.reports.results import number

    if not arms or not all(k in numbers for k in MARGIN_KEYS.values()):
        return "inconclusive"
    readings = [equivalence(number(numbers, f"{arm} {key}"), number(numbers, MARGIN_KEYS[key]).mean)
                for arm in arms for key in MARGIN_KEYS]
    if "not reproduced" in readings:
        return "not reproduced"
    return "reproduced" if set(readings) == {"reproduced"} else "inconclusive"


def rule_readings(numbers: dict) -> dict[str, str]:
    """VERDICT_RULE's readings (a) GRPO, (b) token-mean, (c) shared-stop control, (d) Dr. GRPO, on stored
    intervals."""
    from jaxrl_llm.reports.results import number, side

    def enough(*ivs):
        return all(i.n >= 2 for i in ivs)

    grpo, dapo = (number(numbers, f"{a} - {BASELINE} d split") for a in ("grpo", "dapo"))
    a = ("inconclusive" if not enough(grpo) or side(grpo) == "covers 0" else
         "reproduced" if side(grpo) == "below 0" else "not reproduced")
    if not enough(grpo, dapo):
        b = "inconclusive"
    elif side(dapo) == "above 0" or dapo.high < grpo.mean:
        b = "not reproduced"
    else:
        b = "reproduced" if side(dapo) == "below 0" and dapo.mean > grpo.mean else "inconclusive"
    shared = sorted({k.split(" ")[0] for k in numbers if k.split(" ")[0].endswith("_shared")})
    dr_present = f"{BASELINE} d split" in numbers
    return {"grpo": a, "token-mean": b, "shared-stop": no_effect_reading(numbers, shared),
            "constant normaliser": no_effect_reading(numbers, [BASELINE] if dr_present else [])}


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE's overall verdict from its four readings."""
    readings = set(rule_readings(numbers).values())
    if "not reproduced" in readings:
        return "not reproduced"
    return "reproduced" if readings == {"reproduced"} else "inconclusive"


# ------------------------------------------------------------- per seed, paired, curves
def window_change(curve: Sequence[float], k: int = 5) -> float:
    """Mean of the last k steps minus mean of the first k (finite values only)."""
    values = np.asarray(curve, float)
    k = max(1, min(k, values.size // 2))
    return float(np.nanmean(values[-k:]) - np.nanmean(values[:k]))


def rolling(x, k: int = WINDOW) -> np.ndarray:
    """Mean over a trailing window of k steps (NaN-aware), per row of a [rows, steps] array or one curve."""
    x = np.asarray(x, float)
    out = np.array([[np.nanmean(row[max(0, t - k + 1):t + 1]) for t in range(row.size)] for row in np.atleast_2d(x)])
    return out if x.ndim == 2 else out[0]


def split_curve(log: dict) -> np.ndarray:
    """On-policy q_wrong - q_right: its trailing WINDOW-step mean at every step minus the mean of the
    first WINDOW steps (so its last value is the seed's d split)."""
    split = np.asarray(log["q_own_wrong"], float) - np.asarray(log["q_own_right"], float)
    k = max(1, min(WINDOW, split.size // 2))  # as window_change
    return rolling(split, k) - np.nanmean(split[:k])


def per_seed_row(log: dict) -> dict:
    """One seed's numbers: change of the stop probability (on-policy; and teacher-forced on fixed
    fillers, last step minus step 0), sampled lengths, force."""
    length_split = np.asarray(log["length_wrong"], float) - np.asarray(log["length_right"], float)
    return {
        "q0 right": log["q_right"][0], "q0 wrong": log["q_wrong"][0],
        "dq right": window_change(log["q_own_right"], WINDOW),
        "dq wrong": window_change(log["q_own_wrong"], WINDOW),
        "d split": float(split_curve(log)[-1]),
        "d split fixed fillers": (log["q_wrong"][-1] - log["q_right"][-1]) - (log["q_wrong"][0] - log["q_right"][0]),
        "d length split": window_change(length_split, WINDOW),
        "d length wrong": window_change(log["length_wrong"], WINDOW),
        "d length right": window_change(log["length_right"], WINDOW),
        "force right": float(np.mean(log["force_right"])), "force wrong": float(np.mean(log["force_wrong"])),
        "closed right": float(np.mean(log["closed_right"])), "closed wrong": float(np.mean(log["closed_wrong"])),
        "reward first": log["reward"][0], "reward last": log["reward"][-1],
        "truncated": float(np.mean(log["truncated"])),
    }


ROW_KEYS = ("d split", "dq wrong", "dq right", "d split fixed fillers", "d length split", "d length wrong", "d length right", "force wrong",
            "closed wrong", "force right", "closed right", "reward last", "truncated")


def summarise(arm: str, seeds_rows: list[dict]) -> dict:
    row = {"arm": arm}
    for key in ROW_KEYS:
        iv = stats.interval([r[key] for r in seeds_rows])
        row[key] = stats.format_interval(iv, signed=key.startswith(("d", "force", "closed")))
        row[f"{key} interval"] = iv.to_dict()
    return row


def paired_split(per_seed: dict[str, list[dict]]) -> dict[str, list[float]]:
    """{"<arm> - dr_grpo d split": [per seed]}: each arm's d split minus Dr. GRPO's, seed by seed."""
    base = [r["d split"] for r in per_seed[BASELINE]]
    return {f"{arm} - {BASELINE} d split": [r["d split"] - b for r, b in zip(rows, base)]
            for arm, rows in per_seed.items() if arm != BASELINE}


def paired_curves(logs: dict[str, list[dict]]) -> dict[str, np.ndarray]:
    """{arm: [seeds, steps + 1]} the arm's split curve minus Dr. GRPO's, seed by seed."""
    base = np.array([split_curve(log) for log in logs[BASELINE]])
    return {arm: np.array([split_curve(log) for log in seed_logs]) - base
            for arm, seed_logs in logs.items() if arm != BASELINE}


def band(curves: np.ndarray) -> list[stats.Interval]:
    """The 95% t-interval over seeds (rows) at every step (column)."""
    return [stats.interval(curves[:, t]) for t in range(curves.shape[1])]


def onset(curves: np.ndarray) -> int | None:
    """The first step from which the 95% band over seeds lies below 0 at every later step (None: never)."""
    below = [iv.n >= 2 and iv.high < 0 for iv in band(curves)]
    first = None
    for t, b in enumerate(below):
        first = (t if first is None else first) if b else None
    return first


def pushes(study: MechanismStudy, q0: float) -> dict[str, float]:
    """The closed-form stop-logit push per unit advantage of each recipe at q0 (reports/length_drift.py)."""
    n = NUM_PROMPTS * study.samples
    recipes = study_recipes(study)
    return {a: length_drift.relative_push(recipes[a].aggregation, q0, answer_tokens=0, max_tokens=study.max_tokens - 1,
                                          num_responses=n, constant_length=study.max_tokens)
            for a in ("grpo", "dapo") if a in recipes}


def numbers_of(per_seed: dict[str, list[dict]], study: MechanismStudy | None = None) -> dict[str, dict[str, float]]:
    """The stored intervals: paired d split of every arm, and each arm's own d split and d length split;
    with `study` also its equivalence margins (n = 1: fixed numbers, no interval)."""
    numbers = {k: stats.interval(v).to_dict() for k, v in paired_split(per_seed).items()}
    for arm, rows in per_seed.items():
        for key in ("d split", "d length split"):
            numbers[f"{arm} {key}"] = stats.interval([r[key] for r in rows]).to_dict()
    if study is not None:
        margins = equivalence_margins(study)
        for key, value in ((MARGIN_KEYS["d split"], margins.split), (MARGIN_KEYS["d length split"], margins.length)):
            numbers[key] = {"mean": value, "low": float("nan"), "high": float("nan"), "n": 1}
    return numbers


def deciding_result(per_seed: dict[str, list[dict]], seeds: Sequence[int], study: MechanismStudy, *, command: str,
                    wall_s: float | None, notes: Sequence[str] = ()):
    """The stored result (reports/results.py): VERDICT_RULE on the paired and control intervals."""
    from jaxrl_llm.reports.results import ExperimentResult, keyed

    numbers = numbers_of(per_seed, study)
    readings = rule_readings(numbers)
    values = {**{k: v for k, v in paired_split(per_seed).items()},
              **{f"{arm} {key}": [r[key] for r in rows] for arm, rows in per_seed.items()
                 for key in ("d split", "d length split")}}
    return ExperimentResult(
        name=NAME, title="length-bias mechanism, length-neutral task, tiny decoder, shared-stop control", claim=CLAIM,
        setting=(f"arms {study.arms}; {study.steps} steps, {NUM_PROMPTS} prompts x {study.samples} samples, "
                 f"<= {study.max_tokens} tokens, q0 {study.stop_prob}, lr {study.lr}"),
        command=command, seeds=tuple(seeds), tuning_seeds=TUNING_SEEDS,
        statistic=f"d split (on-policy q_wrong - q_right, mean of the last {WINDOW} steps minus the first "
                  f"{WINDOW}), paired against Dr. GRPO by seed; shared-stop arms and Dr. GRPO: own d split and d "
                  "length split against equivalence margins from the closed-form force",
        interval_method="mean and 95% Student-t over seeds, paired by seed", verdict_rule=VERDICT_RULE,
        verdict=rule_verdict(numbers), headline=f"dapo - {BASELINE} d split", numbers=numbers,
        per_seed={k: keyed(dict(zip(seeds, v))) for k, v in values.items()}, wall_s=wall_s,
        notes=tuple(f"({part}) {claim}: {reading} (n = {len(seeds)})" for part, (claim, reading)
                    in zip("abcd", readings.items())) + tuple(notes))


# ------------------------------------------------------------- figures
COLORS = {"grpo": "tab:red", "dr_grpo": "tab:blue", "dapo": "tab:green", "grpo_shared": "tab:orange",
          "dapo_shared": "tab:olive"}


def _band_plot(ax, curves: np.ndarray, color, label: str) -> None:
    ivs = band(curves)
    steps = np.arange(curves.shape[1])
    ax.plot(steps, [i.mean for i in ivs], color=color, label=label)
    if curves.shape[0] > 1:
        ax.fill_between(steps, [i.low for i in ivs], [i.high for i in ivs], color=color, alpha=0.2)


def plot(logs: dict[str, list[dict]], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(18, 3.9))
    n = len(next(iter(logs.values())))
    for arm, curves in paired_curves(logs).items():
        _band_plot(axes[0], curves, COLORS.get(arm), f"{arm} (n = {n})")
    axes[0].set_title(f"d split, paired: arm minus {BASELINE} (same seed)", fontsize=9)
    axes[0].set_ylabel(f"change of on-policy q_wrong - q_right ({WINDOW}-step mean), 95% band")
    for arm, seed_logs in logs.items():
        for cls, style in (("wrong", "-"), ("right", "--")):
            axes[1].plot(np.nanmean(rolling(np.array([s[f"q_own_{cls}"] for s in seed_logs])), axis=0), style,
                         color=COLORS.get(arm), label=f"{arm} after {cls}")
        lengths = np.array([np.asarray(s["length_wrong"], float) - np.asarray(s["length_right"], float)
                            for s in seed_logs])
        _band_plot(axes[2], rolling(lengths), COLORS.get(arm), arm)
        for cls, marker in (("wrong", "v"), ("right", "^")):
            axes[3].scatter([np.mean(s[f"closed_{cls}"]) for s in seed_logs],
                            [np.mean(s[f"force_{cls}"]) for s in seed_logs], marker=marker, color=COLORS.get(arm),
                            s=16, label=f"{arm} {cls}")
    axes[1].set_title(f"on-policy stop probability after wrong (solid) / right (dashed), {WINDOW}-step mean",
                      fontsize=9)
    axes[2].set_title(f"sampled length, wrong minus right ({WINDOW}-step mean)", fontsize=9)
    lim = axes[3].get_xlim()
    axes[3].plot(lim, lim, "k--", lw=0.7)
    axes[3].set_xlabel("closed-form force per step (seed mean)")
    axes[3].set_ylabel("measured force per step")
    axes[3].set_title("stop-logit force, measured vs closed form", fontsize=9)
    for ax in axes[:3]:
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("RL step")
    for ax in axes:
        ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_token_mean(logs: dict[str, list[dict]], path, *, ratio: float, title: str) -> int | None:
    """Token-mean's own drift: DAPO's and Dr. GRPO's split curves, their paired difference with its
    band and onset, and GRPO's paired curve scaled by the closed-form push ratio (a proportional
    response). Returns the onset step (None: none)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paired = paired_curves(logs)
    start = onset(paired["dapo"])
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.9))
    for arm in ("dapo", BASELINE):
        _band_plot(axes[0], np.array([split_curve(s) for s in logs[arm]]), COLORS[arm], f"{arm} d split")
    axes[0].set_title(f"own split curves (change of on-policy q_wrong - q_right, {WINDOW}-step mean)", fontsize=9)
    _band_plot(axes[1], paired["dapo"], COLORS["dapo"], f"dapo - {BASELINE} (paired)")
    if "grpo" in paired:
        axes[1].plot(paired["grpo"].mean(axis=0) * ratio, "k:", label=f"GRPO's paired mean x {ratio:.3f} (proportional)")
    if start is not None:
        axes[1].axvline(start, color="gray", ls="--", lw=0.8, label=f"onset: step {start}")
    axes[1].set_title("token-mean minus constant normaliser, seed by seed", fontsize=9)
    for ax in axes:
        ax.axhline(0, color="k", lw=0.6)
        ax.set_xlabel("RL step")
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return start


# ------------------------------------------------------------- the run
def report(out: Path, study: MechanismStudy, logs: dict[str, list[dict]], seeds: Sequence[int], *, quick: bool,
           wall_s: float) -> tuple[dict, list[str]]:
    """per_seed.json, summary.md / .json, drift.png and token_mean.png; returns (per_seed rows, notes)."""
    per_seed = {arm: [per_seed_row(log) for log in seed_logs] for arm, seed_logs in logs.items()}
    (out / "per_seed.json").write_text(json.dumps({"study": dataclasses.asdict(study), "seeds": list(seeds),
                                                   "per_seed": per_seed, "logs": logs}, indent=1) + "\n")
    rows = [summarise(arm, rs) for arm, rs in per_seed.items()]
    for key, values in paired_split(per_seed).items():
        iv = stats.interval(values)
        rows.append({"arm": key.removesuffix(" d split") + " (paired)",
                     "d split": stats.format_interval(iv, signed=True), "d split interval": iv.to_dict()})
    q0 = float(np.mean([r["q0 wrong"] for rs in per_seed.values() for r in rs]))
    push = pushes(study, q0)
    ratio = push.get("dapo", 0.0) / push["grpo"] if push.get("grpo") else float("nan")
    notes = [stats.seed_note(seeds, quick=quick, full_seeds=MechanismStudy.seeds),
             f"study: {dataclasses.asdict(study)}; wall time {wall_s:.0f} s",
             "d split: change of q_wrong - q_right, the on-policy stop probability (mean EOS probability at the free "
             "decision points of the step's own samples) after a wrong minus after a right answer, mean of the last "
             f"{WINDOW} steps minus the first {WINDOW}; (paired): minus Dr. GRPO's on the same seed; dq: each class "
             "alone; d split fixed fillers: the same teacher-forced on fixed filler strings, last step minus step 0. "
             f"d length: sampled response length, mean of the last {WINDOW} steps minus the first {WINDOW}; split = "
             "wrong minus right. force: per-step stop-logit force sum w A (1[EOS] - q) from the real step batch; "
             "closed: its closed form (reports/length_drift.py).",
             f"closed-form push per unit advantage at q0 = {q0:.3f}: " + ", ".join(f"{m} {v:+.4f}" for m, v in push.items())
             + f"; token-mean / GRPO = {ratio:.4f}"]
    if {"dapo", "grpo", BASELINE} <= set(logs):
        start = plot_token_mean(logs, out / "token_mean.png", ratio=ratio,
                                title=f"Token-mean's drift, {len(seeds)} seeds x {study.steps} steps")
        grpo_mean = float(np.mean(paired_split(per_seed)[f"grpo - {BASELINE} d split"]))
        notes.append(f"token-mean onset (first step from which the paired DAPO - Dr. GRPO band stays below 0): "
                     f"{'none within ' + str(study.steps) + ' steps' if start is None else 'step ' + str(start)}; "
                     f"a response proportional to the push would be GRPO's paired mean x {ratio:.4f} = "
                     f"{grpo_mean * ratio:+.4f}")
    readings = rule_readings(numbers_of(per_seed, study)) if BASELINE in per_seed and "dapo" in per_seed else {}
    notes += [f"rule reading ({k}): {v} (n = {len(seeds)})" for k, v in readings.items()]
    columns = ["arm", *ROW_KEYS]
    write_summary(out, rows, columns, title=f"Length mechanism ({'quick' if quick else 'full'})", notes=notes,
                  config={"name": NAME, "quick": quick, "seeds": list(seeds), "study": dataclasses.asdict(study)})
    plot(logs, out / "drift.png", title=f"Length-neutral task, {len(seeds)} seeds x {study.steps} steps, "
                                        f"<= {study.max_tokens} tokens")
    return per_seed, notes


def same_study(a: dict, b: dict) -> bool:
    """Two studies' settings agree but for their seed count (a seed's log depends on its own seed only)."""
    return {k: v for k, v in a.items() if k != "seeds"} == {k: v for k, v in b.items() if k != "seeds"}


def finished_seeds(out: Path, study: MechanismStudy, seeds: Sequence[int]) -> dict[int, dict]:
    """The seeds whose every arm finished in an earlier invocation (seeds/<seed>.json of the same study,
    whatever its seed count): {seed: {"logs": ..., "wall_s": its seconds or 0 where not recorded}}."""
    done = {}
    for seed in seeds:
        path = out / "seeds" / f"{seed}.json"
        if path.exists():
            data = json.loads(path.read_text())
            if not same_study(data["study"], dataclasses.asdict(study)):
                raise SystemExit(f"{path} holds another study ({data['study']}); use --out elsewhere or --fresh")
            done[seed] = {"logs": data["logs"], "wall_s": float(data.get("wall_s", 0.0))}
    return done


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.results import machine, write_result
    from jaxrl_llm.train.run.provenance import git_commit, git_dirty

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = experiment_parser(__doc__, name=NAME, results=True)
    parser.add_argument("--seeds", default=None, help="comma-separated seeds (default 0 .. study.seeds - 1)")
    args = parser.parse_args(argv)
    study = get_config("quick" if args.quick else "")
    fields = {f.name: f.type for f in dataclasses.fields(MechanismStudy)}
    casts = {"float": float, "int": int, "str": str}
    for item in args.overrides:  # e.g. seeds=2 steps=3 arms=grpo,dr_grpo
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"override {item!r}: valid keys are {', '.join(fields)}")
        study = dataclasses.replace(study, **{key: casts[fields[key]](value)})
    seeds = stats.parse_seeds(args.seeds, range(study.seeds))
    study = dataclasses.replace(study, seeds=len(seeds))
    out = output_dir(args, NAME)
    provenance = {"commit": git_commit(), "dirty": git_dirty()}  # the code that runs, before any later edit
    start = time.time()
    done = finished_seeds(out, study, seeds)
    earlier = sum(d["wall_s"] for d in done.values())  # seeds finished by an earlier invocation
    (out / "seeds").mkdir(exist_ok=True)
    last = [start]

    def keep(seed: int, seed_logs: dict) -> None:
        now = time.time()
        (out / "seeds" / f"{seed}.json").write_text(json.dumps({"study": dataclasses.asdict(study),
                                                               "logs": seed_logs, "wall_s": now - last[0]}) + "\n")
        done[seed] = {"logs": seed_logs, "wall_s": now - last[0]}
        last[0] = now

    run_study(study, name=NAME, seeds=[s for s in seeds if s not in done], on_seed=keep)
    logs = {arm: [done[s]["logs"][arm] for s in seeds] for arm in study.arm_names()}
    wall_s = time.time() - start + earlier
    per_seed, notes = report(out, study, logs, seeds, quick=args.quick, wall_s=wall_s)
    print(f"wrote {out}/summary.md, drift.png, per_seed.json")
    if args.results:
        command = "python experiments/length_mechanism.py " + shlex.join(argv)
        result = deciding_result(per_seed, seeds, study, command=command, wall_s=wall_s,
                                 notes=[n for n in notes if n.startswith(("closed-form", "token-mean onset"))]
                                 + ([f"wall time: this invocation plus {earlier:.0f} s of seeds finished by an "
                                     f"earlier one"] if earlier else []))
        path = write_result(result, args.results, provenance={
            **provenance, "machine": machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())})
        print(f"wrote {path}: {result.verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
