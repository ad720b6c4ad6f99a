"""Experiment 8: diversity. Does DARLING's diversity reweighting raise pass@k at large k
without lowering pass@1?

Claim (Li et al. 2025, DARLING, arXiv 2509.02534): multiplying each correct answer's
reward by the share of its group outside its answer's class (core.diversity_from_classes)
keeps the policy from collapsing onto one correct answer, so pass@k at large k rises
while pass@1 holds. Expected here: identical to GRPO while a group's correct answers are
all distinct (the factor is then the same for all of them and GRPO's std normalisation
cancels it); once GRPO repeats a correct answer, DARLING pays the repeats less, so it
keeps more distinct correct answers per prompt; pass@k at large k gains only where
collapse costs coverage of the questions a policy gets wrong.

Setting (CPU-sized): the many-answers task `multiple_of` ("Name a multiple of k between
1 and M", k in 2..5, M in 50..99: >= 10 correct answers each; data/many_answers.py) and
a tiny random decoder whose vocabulary is the ten digits and EOS (`answer_tokenizer`),
built to answer in digits (`digit_model`: digits ~60%, EOS ~40% of the probability at
every position, so its answers are random numbers and ~10% are right at first). GRPO vs
GRPO + shaping.darling=answer from the same weights and seeds, JAX sampler at temperature
1, lr 1e-2. Held-out evaluation every few steps (task.eval_every) with 16 samples per
prompt gives pass@k for k = 1..16 (unbiased estimator) and the distinct correct answers
per prompt.

    python experiments/diversity.py --quick     # 3 seeds x 2 variants x 20 steps (<= 15 min on 2 cores)
    python experiments/diversity.py             # 5 seeds x 2 variants x 40 steps
    python experiments/diversity.py --seeds 2070,2071,...,2089 --out runs/experiments/diversity/tune \\
        --tuning experiments/tuning/diversity_answer_vocab_lr1e-2_200steps_amd_epyc.json \\
        rollout.max_tokens=2 train.lr=1e-2 total_steps=200 task.eval_every=50   # the divergence check
    python experiments/diversity.py --seeds 3000,3001,...,3019 --out runs/experiments/diversity/deciding \\
        --results experiments/results/diversity.json rollout.max_tokens=2 train.lr=1e-2 total_steps=200 \\
        task.eval_every=50              # the deciding run: DECIDING_SEEDS x DECIDING, VERDICT_RULE

Writes to runs/experiments/diversity/<quick|full>/: <variant>_s<seed>/ (runs), model/ (the
digit decoder), pass_at_k.png (final pass@k curve, mean and 95% band over seeds, seeds as
points), seeds.png (training distinct correct answers and pass rate per step, bands),
summary.md / .json (means, 95% t-intervals over seeds, paired DARLING - GRPO differences
and the verdict).
"""
from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from jaxrl_llm.reports import stats
from jaxrl_llm.reports.runs import experiment_parser, interval_row, output_dir, run_seeded_experiment, window_mean, \
    write_summary
from jaxrl_llm.train.config import Config, ConfigError, config_from_dict

NAME = "diversity"
VARIANTS = {"grpo": [], "darling": ["shaping.darling=answer"]}
SEEDS, QUICK_SEEDS = (0, 1, 2, 3, 4), (0, 1, 2)
QUICK = ("total_steps=20", "task.eval_every=10")
EVAL_SAMPLES = 16
EOS_ID = 0  # the answer vocabulary's stop token (`answer_tokenizer`)
DIGIT_WEIGHT, EOS_WEIGHT = 2.2, 2.55  # lm_head rows along the shared direction: logits ~12.4 and ~14.4


def answer_tokenizer():
    """An 11-token vocabulary: the ten digits and <|im_end|> (EOS_ID), which ends an answer and,
    as the unknown token with runs of unknown characters fused, stands for each stretch of
    non-digit text in the prompt ("Name a multiple of 3 between 1 and 57. ..." -> EOS 3 EOS 1
    EOS 5 7 EOS). The chat template is the question alone. Why: every token the policy can emit
    is part of an answer. Over SmolLM2's 49152 tokens (issue 36's model) training could tip the
    policy onto the 49141 others, where no sample scores, no gradient is left and it stays
    (experiments/README.md section 8); 88 others (a character vocabulary) or others held down
    by their own lm_head direction still did."""
    from tokenizers import Tokenizer, decoders, models

    from jaxrl_llm.bridge.tokenizer import TokenizerBundle

    eos = "<|im_end|>"
    vocab = {eos: EOS_ID, **{str(d): d + 1 for d in range(10)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=eos, fuse_unk=True))
    tokenizer.decoder = decoders.Fuse()
    template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return TokenizerBundle(tokenizer, bos_token=None, eos_token=eos, pad_token=eos, unk_token=eos,
                           chat_template=template)


def digit_model(out: Path) -> str:
    """A random 2-layer decoder over `answer_tokenizer` (the ten digits and EOS) that answers
    in digits: every token embedding shares a direction u, and the lm_head rows of the digits
    and of EOS point along u, so at every position the digits share ~58% of the probability
    (evenly) and EOS ~42%; answers are random numbers of up to max_tokens digits. Built from a
    fixed key; written once to `out` (an HF directory)."""
    if (out / "config.json").exists():
        return str(out)
    import jax
    import jax.numpy as jnp

    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    tokenizer = answer_tokenizer()
    digits = jnp.array([tokenizer.tokenizer.token_to_id(str(d)) for d in range(10)])
    cfg = tiny_decoder_config(vocab_size=tokenizer.tokenizer.get_vocab_size(), tie_word_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    u = jnp.ones(cfg.hidden_size) / jnp.sqrt(cfg.hidden_size)
    params["embed"] = params["embed"] + 5.0 * u
    head = params["lm_head"].at[:, digits].set(jnp.broadcast_to((DIGIT_WEIGHT * u)[:, None], (cfg.hidden_size, 10)))
    params["lm_head"] = head.at[:, EOS_ID].set(EOS_WEIGHT * u)
    bridge.save_hf_dir(cfg, params, out, tokenizer=tokenizer)
    return str(out)


def get_config(variant: str = "grpo", seed: int = 0, model_dir: str = "") -> Config:
    """VARIANT = grpo or darling (GRPO + shaping.darling=answer) on `multiple_of`."""
    if variant not in VARIANTS:
        raise ConfigError(f"experiments/diversity.py:{variant} is invalid; valid: one of {tuple(VARIANTS)}")
    cfg = config_from_dict({
        "name": f"{NAME}_{variant}", "seed": seed, "total_steps": 40,
        "model": {"source": model_dir or "smollm2"},
        "rollout": {"engine": "jax", "prompts_per_step": 4, "samples_per_prompt": 8, "max_tokens": 4,
                    "temperature": 1.0},
        "recipe": {"name": "grpo"},
        "train": {"lr": 1e-2, "warmup_steps": 0, "micro_batch_size": 16, "precision": "fp32", "grad_clip": 1.0},
        "task": {"name": "multiple_of", "eval_size": 16, "eval_samples": EVAL_SAMPLES, "eval_every": 10},
        "checkpoint": {"every_steps": 10, "keep": 1, "async_save": False},
        "metrics": {"tensorboard": False, "progress_every": 5},
    })
    from jaxrl_llm.train.config import apply_overrides

    return apply_overrides(cfg, VARIANTS[variant])


# ------------------------------------------------------------------ analysis
def read_eval(run: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run) / "eval.jsonl").read_text().splitlines() if line.strip()]


def seed_row(metrics: Sequence[dict], evals: Sequence[dict]) -> dict:
    """One seed's numbers: the final evaluation's pass@1, pass@4, pass@16, distinct correct
    answers per held-out prompt (of 16 samples), and the training distinct correct answers
    per group (of 8 samples) over the last third of the steps."""
    final = evals[-1] if evals else {"pass_at_k": [float("nan")] * EVAL_SAMPLES, "distinct_correct": []}
    curve = final["pass_at_k"]
    third = max(1, len(metrics) // 3)
    return {"pass@1": curve[0], "pass@4": curve[min(3, len(curve) - 1)], "pass@16": curve[-1],
            "distinct correct / prompt": float(np.mean(final["distinct_correct"])) if final["distinct_correct"]
            else float("nan"),
            "train distinct correct / group (last third)": window_mean(metrics, "distinct_correct", last=third),
            "train pass rate (last third)": window_mean(metrics, "pass_rate", last=third)}


# ------------------------------------------- the deciding run: fixed before it ran (issue 51)
# Issue 36's run (seeds 100-115, over SmolLM2's 49152 tokens; seed 0 chose lr 1e-2) kept 11 of 16
# seeds after divergence, and its command on an Intel Xeon (seeds 1000-1015) saw 7 and 8 of 16 runs
# diverge: that verdict rests on which seeds survive. The divergence was the policy tipping onto
# tokens that never answer (experiments/README.md section 8); the digit decoder now emits only digits
# and EOS (`answer_tokenizer`). Tuning seeds (experiments/tuning/, never counted): 2000-2029 (old
# model, lr 5e-3 and 3e-3), 2030-2033 (99-token model), 2050-2053 (99 tokens, others along -v),
# 2070-2089 (this model at the settings below: the < 10 % divergence check passed before this rule
# was written). Seeds 100-115 and 1000-1015 are not reused.
TUNING_SEEDS = (0, *range(2000, 2034), *range(2050, 2054), *range(2070, 2090))
DECIDING_SEEDS = tuple(range(3000, 3020))
DECIDING = ("rollout.max_tokens=2", "train.lr=1e-2", "total_steps=200", "task.eval_every=50")
MIN_PAIRS = 16
MAX_DIVERGED = 0.1  # share of one variant's runs
CLAIM = "DARLING raises pass@16 without lowering pass@1 (Li et al. 2025, arXiv 2509.02534)"
EXCLUSION_RULE = ("a run has diverged when its held-out pass@16 at the final evaluation is 0 (no held-out "
                  "prompt solved in 16 samples); a seed counts only when neither variant diverged; each variant's "
                  "divergence count is reported, and the paired differences over all seeds, without exclusion, "
                  "beside the kept ones")
VERDICT_RULE = (f"seeds {DECIDING_SEEDS[0]}-{DECIDING_SEEDS[-1]}, fresh, the digits-and-EOS decoder, "
                f"{', '.join(DECIDING)} (checked for rare divergence on tuning seeds 2070-2089); if more than "
                f"{MAX_DIVERGED:.0%} of either variant's runs diverged, inconclusive (a verdict would rest on which "
                f"seeds survive); otherwise, on the kept seeds, paired DARLING - GRPO at the final evaluation, 95% "
                f"Student-t: reproduced if the pass@16 interval lies above 0 and the pass@1 interval's upper end is "
                f">= 0; not reproduced if the pass@16 or the pass@1 interval lies below 0; otherwise, or with fewer "
                f"than {MIN_PAIRS} kept seeds, inconclusive")


def diverged(row: dict) -> bool:
    """EXCLUSION_RULE on one run's `seed_row`."""
    return row["pass@16"] == 0


def verdict(diff_pass1: stats.Interval, diff_passk: stats.Interval, *, min_pairs: int = 2) -> str:
    """The paired part of VERDICT_RULE on DARLING - GRPO intervals over the kept seeds."""
    if diff_passk.n < max(2, min_pairs):
        return "inconclusive"
    if diff_passk.high < 0 or diff_pass1.high < 0:
        return "not reproduced"
    return "reproduced" if diff_passk.low > 0 else "inconclusive"


def deciding_result(per_seed: dict, seeds: Sequence[int], *, command: str, wall_s: float | None):
    """The stored result (reports/results.py) of a run: EXCLUSION_RULE, then VERDICT_RULE."""
    from jaxrl_llm.reports.results import ExperimentResult, keyed, paired

    out = {v: {s: per_seed[(v, s)] for s in seeds} for v in VARIANTS}
    excluded = {str(s): "+".join(v for v in VARIANTS if diverged(out[v][s])) + " diverged"
                for s in seeds if any(diverged(out[v][s]) for v in VARIANTS)}
    kept = [s for s in seeds if str(s) not in excluded]
    keys = ("pass@1", "pass@16", "distinct correct / prompt")
    numbers = {}
    for label, chosen in (("", kept), (" (all seeds)", list(seeds))):
        for k in keys:
            diff = paired({s: out["darling"][s][k] for s in chosen}, {s: out["grpo"][s][k] for s in chosen})
            numbers[f"darling - grpo {k}{label}"] = stats.interval(list(diff.values())).to_dict()
    for v in VARIANTS:
        numbers[f"{v} diverged (of {len(seeds)})"] = {"mean": float(sum(diverged(out[v][s]) for s in seeds)),
                                                       "low": float("nan"), "high": float("nan"), "n": len(seeds)}
    reading = rule_verdict(numbers)
    return ExperimentResult(
        name=NAME, title="diversity: GRPO vs DARLING, many-answers task, tiny digits-and-EOS decoder", claim=CLAIM,
        setting="multiple_of, digits-and-EOS decoder, 4 prompts x 8 samples, " + ", ".join(DECIDING),
        command=command, seeds=tuple(kept), tuning_seeds=TUNING_SEEDS, statistic="paired DARLING - GRPO, "
        "held-out pass@1 / pass@16 (unbiased, 16 prompts x 16 samples) at the final step",
        interval_method="mean and 95% Student-t over seeds", verdict_rule=VERDICT_RULE, verdict=reading,
        headline="darling - grpo pass@16", numbers=numbers, exclusion_rule=EXCLUSION_RULE, excluded=excluded,
        per_seed={f"{v} {k}": keyed({s: out[v][s][k] for s in seeds}) for v in VARIANTS for k in keys},
        wall_s=wall_s)


def tuning_record(per_seed: dict, seeds: Sequence[int], *, command: str, wall_s: float | None,
                  run_commits: Sequence[str] = ()) -> dict:
    """What a tuning run (seeds that never decide) shows about a setting: each variant's diverged
    runs (EXCLUSION_RULE) and share, and every seed's final pass@1 / pass@16; with the commit,
    machine and wall time, as a stored result has them, and the commits the runs trained at (a
    rerun keeps finished runs, so they may be older than the commit that wrote the record)."""
    from jaxrl_llm.reports.results import code_version, machine

    commit, dirty = code_version()
    variants = {}
    for v in VARIANTS:
        runs = {str(s): {"pass@1": per_seed[(v, s)]["pass@1"], "pass@16": per_seed[(v, s)]["pass@16"],
                         "diverged": diverged(per_seed[(v, s)])} for s in seeds}
        count = sum(r["diverged"] for r in runs.values())
        variants[v] = {"diverged": count, "of": len(seeds), "share": count / len(seeds), "per_seed": runs}
    return {"name": NAME, "kind": "tuning (these seeds never decide)", "command": command, "seeds": list(seeds),
            "exclusion_rule": EXCLUSION_RULE, "variants": variants, "commit": commit, "dirty": dirty,
            "run_commits": sorted(set(run_commits)),
            "machine": machine(), "wall_s": wall_s, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def plot_pass_at_k(curves: dict[str, list[list[float]]], path: Path, *, title: str) -> None:
    """Final pass@k against k per variant: mean, 95% band over seeds and each seed as points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxrl_llm.reports.seed_curves import COLORS

    fig, ax = plt.subplots(figsize=(5, 3.8))
    for color, (variant, seeds) in zip(COLORS, curves.items()):
        values = np.asarray(seeds, float)  # [seeds, k]
        ks = np.arange(1, values.shape[1] + 1)
        ivs = [stats.interval(values[:, i]) for i in range(values.shape[1])]
        ax.plot(ks, [i.mean for i in ivs], color=color, label=f"{variant} (n = {len(seeds)})")
        if len(seeds) > 1:
            ax.fill_between(ks, [i.low for i in ivs], [i.high for i in ivs], color=color, alpha=0.2)
        for row in values:
            ax.scatter(ks, row, color=color, s=6, alpha=0.5)
    ax.set_xlabel("k")
    ax.set_ylabel("held-out pass@k")
    ax.legend(fontsize=7)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)



def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored numbers: each variant's divergence share, then the kept seeds'
    paired intervals (`verdict`)."""
    from jaxrl_llm.reports.results import number

    for v in VARIANTS:
        count = next(numbers[k] for k in numbers if k.startswith(f"{v} diverged (of "))
        if count["mean"] > MAX_DIVERGED * count["n"]:
            return "inconclusive"
    return verdict(number(numbers, "darling - grpo pass@1"), number(numbers, "darling - grpo pass@16"),
                   min_pairs=MIN_PAIRS)


def main(argv: Sequence[str] | None = None) -> int:
    start = time.perf_counter()
    parser = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True)
    parser.add_argument("--tuning", default=None, metavar="PATH",
                        help="also write a tuning record (divergence per variant and seed) to PATH")
    args = parser.parse_args(argv)
    out = output_dir(args, NAME)
    from jaxrl_llm.reports.seed_curves import plot_seed_bands
    from jaxrl_llm.train.run.metrics import read_metrics

    model_dir = digit_model(out / "model")
    done = run_seeded_experiment(args, out, tuple(VARIANTS), lambda v, s: get_config(v, s, model_dir), QUICK,
                                 model_source=model_dir)
    seeds, runs = done.seeds, done.runs
    metrics = {key: read_metrics(run) for key, run in runs.items()}
    evals = {key: read_eval(run) for key, run in runs.items()}
    per_seed = {key: seed_row(metrics[key], evals[key]) for key in runs}

    plot_pass_at_k({v: [evals[(v, s)][-1]["pass_at_k"] for s in seeds] for v in VARIANTS}, out / "pass_at_k.png",
                   title=f"Diversity: final held-out pass@k ({len(seeds)} seed(s))")
    plot_seed_bands({v: [{k: [r.get(k, float("nan")) for r in metrics[(v, s)]] for k in ("distinct_correct",
                                                                                          "pass_rate")}
                         for s in seeds] for v in VARIANTS},
                    ("distinct_correct", "pass_rate"), out / "seeds.png",
                    title=f"Diversity: training distinct correct answers per group and pass rate ({len(seeds)} seed(s))")
    columns = ["variant", "seeds", *seed_row([], []).keys()]
    keys = columns[2:]
    rows = []
    for v in VARIANTS:
        row = interval_row({"variant": v, "seeds": len(seeds)}, {s: per_seed[(v, s)] for s in seeds}, keys)
        row["final pass@k (mean over seeds)"] = np.mean([evals[(v, s)][-1]["pass_at_k"] for s in seeds],
                                                        axis=0).tolist()
        rows.append(row)
    paired = {s: {k: per_seed[("darling", s)][k] - per_seed[("grpo", s)][k] for k in keys} for s in seeds}
    diff_row = interval_row({"variant": "darling - grpo (paired)", "seeds": len(seeds)}, paired, keys,
                            signed=lambda key: True)
    diffs = {k: stats.Interval(**diff_row[f"{k} interval"]) for k in keys}
    rows.append(diff_row)
    reading = verdict(diffs["pass@1"], diffs["pass@16"])
    diff_row["verdict"] = reading
    write_summary(out, rows, columns, title=f"Diversity: GRPO vs DARLING ({'quick' if args.quick else 'full'})",
                  notes=[stats.seed_note(seeds, quick=args.quick, full_seeds=len(SEEDS)),
                         f"claim (DARLING raises pass@16 without lowering pass@1): {reading}",
                         "pass@k: unbiased estimator over 16 samples per held-out prompt (16 prompts) at the "
                         "final step; distinct correct: distinct extracted answers among the correct samples."],
                  config={"name": NAME, "quick": args.quick, "seeds": list(seeds),
                          "variants": {f"{v}_s{s}": c.to_dict() for (v, s), c in done.configs.items()}})
    print(f"wrote {out}/pass_at_k.png, seeds.png, summary.md")
    command = "python experiments/diversity.py " + shlex.join(sys.argv[1:] if argv is None else argv)
    if args.tuning:
        commits = [json.loads((Path(run) / "run_info.json").read_text()).get("git_commit") or "?"
                   for run in runs.values()]
        record = tuning_record(per_seed, seeds, command=command, wall_s=time.perf_counter() - start,
                               run_commits=commits)
        Path(args.tuning).parent.mkdir(parents=True, exist_ok=True)
        Path(args.tuning).write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.tuning}: diverged " + ", ".join(
            f"{v} {r['diverged']} of {r['of']}" for v, r in record["variants"].items()))
    if args.results:
        from jaxrl_llm.reports.results import write_result

        path = write_result(deciding_result(per_seed, seeds, command=command, wall_s=time.perf_counter() - start),
                            args.results)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
