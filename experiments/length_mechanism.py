"""Experiment 5: the length-bias mechanism on a length-neutral task, through the real learner.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1): when the reward
cannot depend on length, does GRPO's 1/|o_i| normalisation by itself lengthen wrong
answers and shorten right ones, while a constant normaliser (Dr. GRPO) does not and
token-mean (DAPO) sits in between? The closed form (reports/length_drift.py,
docs/objectives.md#length-drift-on-a-length-neutral-task) says: the stop logit after a wrong
answer falls under GRPO, stays put in expectation under a constant normaliser, and
falls ~1/N as much under token-mean.

The task: a prompt token, then ONE answer token graded alone (RIGHT = 1, anything else
= 0), then free filler tokens until EOS. The policy: a tiny decoder (models/, 2 layers,
16-token vocabulary) trained from scratch by supervised learning on that format with
P(answer = RIGHT) = 1/2 and a stop probability q0 at every free position, so its stop
probability does not depend on the answer when RL starts. Each recipe then trains it
from the same weights with the real learner (train/learner.py Learner: the recipe's
core.prepare_step_batch + core.recipe_loss, AdamW); samples come from the decoder itself
at temperature 1. The answer token is left out of the loss mask, so P(RIGHT) stays near
1/2, every group keeps a mix of right and wrong answers, and only the free part (the
length) is trained: the derivation with a = 0 answer tokens in L. Measured per step: the policy's EOS probability at the free positions
after a right and after a wrong answer (teacher-forced on fixed filler strings), sampled
lengths, and the step's stop-logit force sum_it w_it A_i (1[EOS] - q_it) read off the
real step batch, next to its closed form. The task, the decoder, its sampler and the RL loop
are jaxrl_llm/reports/length_mechanism.py; this file sizes the study and reports it.

    python experiments/length_mechanism.py --quick     # 5 seeds x 3 recipes x 40 steps, ~6 min on 2 busy CPU cores
    python experiments/length_mechanism.py             # 10 seeds x 3 recipes x 80 steps, ~15-30 min (not run yet)

Writes to runs/experiments/length_mechanism/<quick|full>/: summary.md / .json (drift with
95% t-intervals over seeds), per_seed.json, drift.png (stop probability over steps: mean
and band over seeds), force.png (measured vs closed-form force per seed), run_info.json.
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Sequence

import numpy as np

from jaxrl_llm.reports import length_drift, stats
from jaxrl_llm.reports.length_mechanism import NUM_PROMPTS, RECIPES, MechanismStudy, run_study, study_recipes
from jaxrl_llm.reports.runs import experiment_parser, output_dir, write_summary

NAME = "length_mechanism"
QUICK = dataclasses.replace(MechanismStudy(), seeds=5, steps=40)
SIZES = {"": MechanismStudy(), "quick": QUICK}


def get_config(arg: str = "") -> MechanismStudy:
    """ARG = "" (full size) or "quick": the study's settings (not a `jaxrl train` config: the
    study runs its own RL loop, reports/length_mechanism.py)."""
    if arg not in SIZES:
        raise ValueError(f"experiments/length_mechanism.py:{arg} is invalid; valid: one of {tuple(SIZES)}")
    return SIZES[arg]


def window_change(curve: list[float], k: int = 5) -> float:
    """Mean of the last k steps minus mean of the first k (finite values only)."""
    values = np.asarray(curve, float)
    k = max(1, min(k, values.size // 2))
    return float(np.nanmean(values[-k:]) - np.nanmean(values[:k]))


def per_seed_row(log: dict) -> dict:
    """One seed's numbers: drift of the stop probability (last - first), mean force and closed form."""
    return {
        "q0 right": log["q_right"][0], "q0 wrong": log["q_wrong"][0],
        "dq right": log["q_right"][-1] - log["q_right"][0],
        "dq wrong": log["q_wrong"][-1] - log["q_wrong"][0],
        "d split": (log["q_wrong"][-1] - log["q_right"][-1]) - (log["q_wrong"][0] - log["q_right"][0]),
        "force right": float(np.mean(log["force_right"])), "force wrong": float(np.mean(log["force_wrong"])),
        "closed right": float(np.mean(log["closed_right"])), "closed wrong": float(np.mean(log["closed_wrong"])),
        "d length wrong": window_change(log["length_wrong"]), "d length right": window_change(log["length_right"]),
        "reward first": log["reward"][0], "reward last": log["reward"][-1],
        "truncated": float(np.mean(log["truncated"])),
    }


def summarise(recipe: str, seeds_rows: list[dict]) -> dict:
    row = {"recipe": recipe}
    for key in ("d split", "dq wrong", "dq right", "d length wrong", "d length right", "force wrong", "closed wrong", "force right", "closed right",
                "reward last", "truncated"):
        iv = stats.interval([r[key] for r in seeds_rows])
        row[key] = stats.format_interval(iv, signed=key.startswith(("d", "force", "closed")))
        row[f"{key} interval"] = iv.to_dict()
    return row


def verdict(rows: dict[str, dict]) -> list[str]:
    """Derived: the split q_wrong - q_right falls under GRPO, stays put in expectation under a
    constant normaliser (Dr. GRPO), falls ~1/N as much under token-mean (DAPO)."""
    iv = {r: stats.Interval(**rows[r]["d split interval"]) for r in rows}
    lines = []

    def side(i):
        if i.n < 2:
            return "inconclusive (1 seed)"
        return "below 0" if i.high < 0 else "above 0" if i.low > 0 else "covers 0"

    if "grpo" in iv:
        lines.append(f"GRPO: derived split < 0 (wrong answers lengthen relative to right ones); measured interval "
                     f"{side(iv['grpo'])}: {'reproduced' if side(iv['grpo']) == 'below 0' else 'not reproduced'}")
    if "dr_grpo" in iv:
        lines.append(f"Dr. GRPO: derived split 0 in expectation; measured interval {side(iv['dr_grpo'])}: "
                     f"{'consistent' if side(iv['dr_grpo']) == 'covers 0' else 'not consistent'}")
    if {"grpo", "dr_grpo", "dapo"} <= set(iv):
        g, d, a = iv["grpo"].mean, iv["dr_grpo"].mean, iv["dapo"].mean
        lines.append(f"DAPO token-mean: derived between, close to Dr. GRPO (~1/N of GRPO's push); measured mean split "
                     f"{a:+.4f} (GRPO {g:+.4f}, Dr. GRPO {d:+.4f}), interval {side(iv['dapo'])}")
    return lines


def plot(logs: dict[str, list[dict]], path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, axes = plt.subplots(1, 4, figsize=(17, 3.8))
    colors = {"grpo": "tab:red", "dr_grpo": "tab:blue", "dapo": "tab:green"}
    panels = ((axes[0], "split", "split: after wrong minus after right"),
              (axes[1], "q_wrong", "after a wrong answer"), (axes[2], "q_right", "after a right answer"))
    for ax, key, label in panels:
        for recipe, seed_logs in logs.items():
            series = [np.asarray(s["q_wrong"]) - np.asarray(s["q_right"]) if key == "split" else np.asarray(s[key])
                      for s in seed_logs]
            curves = np.array([x - x[0] for x in series])
            steps = np.arange(curves.shape[1])
            mean = curves.mean(axis=0)
            ivs = [stats.interval(curves[:, t]) for t in range(curves.shape[1])]
            ax.plot(steps, mean, color=colors.get(recipe), label=f"{recipe} (n = {len(seed_logs)})")
            ax.fill_between(steps, [i.low for i in ivs], [i.high for i in ivs], color=colors.get(recipe), alpha=0.2)
        ax.axhline(0, color="k", lw=0.6)
        ax.set_title(f"stop probability change {label}", fontsize=9)
        ax.set_xlabel("RL step")
    axes[0].set_ylabel("q(step) - q(0), mean and 95% band over seeds")
    axes[0].legend(fontsize=7)
    ax = axes[3]
    for recipe, seed_logs in logs.items():
        for cls, marker in (("wrong", "v"), ("right", "^")):
            x = [np.mean(s[f"closed_{cls}"]) for s in seed_logs]
            y = [np.mean(s[f"force_{cls}"]) for s in seed_logs]
            ax.scatter(x, y, marker=marker, color=colors.get(recipe), s=18,
                       label=f"{recipe} {cls}" if recipe == "grpo" or cls == "wrong" else None)
    lim = ax.get_xlim()
    ax.plot(lim, lim, "k--", lw=0.7)
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(5))
    ax.set_xlabel("closed-form force per step (seed mean)")
    ax.set_ylabel("measured force per step (seed mean)")
    ax.set_title("stop-logit force, measured vs closed form (seeds)", fontsize=9)
    ax.legend(fontsize=6)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out, study: MechanismStudy, logs: dict[str, list[dict]], *, quick: bool, wall_s: float) -> None:
    """per_seed.json, summary.md / .json and drift.png from the per-step logs of every seed."""
    seeds = list(range(len(logs[RECIPES[0]])))
    n = NUM_PROMPTS * study.samples
    recipes = study_recipes(study)
    per_seed = {r: [per_seed_row(log) for log in logs[r]] for r in RECIPES}
    (out / "per_seed.json").write_text(json.dumps({"study": dataclasses.asdict(study), "per_seed": per_seed,
                                                   "logs": logs}, indent=1) + "\n")
    rows = {r: summarise(r, per_seed[r]) for r in RECIPES}
    q0 = float(np.mean([r["q0 wrong"] for rs in per_seed.values() for r in rs]))
    pushes = {recipes[r].aggregation: length_drift.relative_push(
        recipes[r].aggregation, q0, answer_tokens=0, max_tokens=study.max_tokens - 1, num_responses=n,
        constant_length=study.max_tokens) for r in RECIPES}
    notes = [stats.seed_note(seeds, quick=quick, full_seeds=MechanismStudy.seeds),
             f"study: {dataclasses.asdict(study)}; wall time {wall_s:.0f} s",
             "d split: change of q_wrong - q_right (stop probability after a wrong minus after a right answer), "
             "last step minus start; dq: each alone (teacher-forced on fixed "
             "fillers). force: per-step stop-logit force sum w A (1[EOS] - q) from the real step batch; closed: its "
             "closed form (reports/length_drift.py) at the step's advantages and mean q.",
             "d length: sampled response length (tokens: answer + free part), mean of the last 5 steps minus the "
             "first 5.",
             "closed-form push per unit advantage relative to the mode's mean token weight at q0 = "
             f"{q0:.3f}: " + ", ".join(f"{m} {v:+.4f}" for m, v in pushes.items()),
             *verdict(rows)]
    columns = ["recipe", "d split", "dq wrong", "dq right", "d length wrong", "d length right", "force wrong",
               "closed wrong", "force right", "closed right", "reward last", "truncated"]
    write_summary(out, list(rows.values()), columns, title=f"Length mechanism ({'quick' if quick else 'full'})",
                  notes=notes, config={"name": NAME, "quick": quick, "study": dataclasses.asdict(study)})
    plot(logs, out / "drift.png", title=f"Length-neutral task, {len(seeds)} seeds: stop probability drift by recipe")




# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = ("GRPO: wrong answers lengthen and right ones shorten on a length-neutral task; constant normaliser "
         "(Dr. GRPO): no drift; token-mean (DAPO) in between (Liu et al. 2025, arXiv 2503.20783)")
VERDICT_RULE = ("95% Student-t intervals over seeds of d split (q_wrong - q_right, last step minus step 0): "
                "reproduced if GRPO's lies below 0, Dr. GRPO's covers 0 and DAPO's lies below 0 with a mean above "
                "GRPO's; not reproduced if GRPO's lies above 0, Dr. GRPO's excludes 0 or DAPO's lies above 0; "
                "otherwise inconclusive")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored d split intervals."""
    from jaxrl_llm.reports.results import number, side

    grpo, dr, dapo = (number(numbers, f"{r} d split") for r in ("grpo", "dr_grpo", "dapo"))
    if side(grpo) == "above 0" or side(dr) != "covers 0" or side(dapo) == "above 0":
        return "not reproduced"
    if side(grpo) == "below 0" and side(dapo) == "below 0" and dapo.mean > grpo.mean:
        return "reproduced"
    return "inconclusive"


def main(argv: Sequence[str] | None = None) -> int:
    parser = experiment_parser(__doc__, name=NAME)
    args = parser.parse_args(argv)
    study = get_config("quick" if args.quick else "")
    fields = {f.name: f.type for f in dataclasses.fields(MechanismStudy)}
    for item in args.overrides:  # e.g. seeds=2 steps=3
        key, _, value = item.partition("=")
        if key not in fields:
            raise SystemExit(f"override {item!r}: valid keys are {', '.join(fields)}")
        study = dataclasses.replace(study, **{key: (float if fields[key] == "float" else int)(value)})
    out = output_dir(args, NAME)
    start = time.time()
    logs = run_study(study, name=NAME)
    report(out, study, logs, quick=args.quick, wall_s=time.time() - start)
    print(f"wrote {out}/summary.md, drift.png, per_seed.json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
