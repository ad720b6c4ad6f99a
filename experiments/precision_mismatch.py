"""Experiment 2: sampler-learner precision mismatch (fp32 / bf16 / fp16).

Question (Qi et al. 2025, arXiv 2510.26788): does FP16 cut the mismatch between
the rollout engine's probabilities mu and the learner's pi by an order of
magnitude against BF16 (their KL 7.64 vs 0.32, ~24x), and does the sequence
log-ratio stop drifting with length?

    python experiments/precision_mismatch.py --quick    # ~10 min on 2 CPU cores
    python experiments/precision_mismatch.py            # CPU full size
    python experiments/precision_mismatch.py --engines jax   # without the vLLM servers
    python experiments/precision_mismatch.py --out runs/experiments/precision_mismatch/full_sS seed=S
    python experiments/precision_mismatch.py --collect runs/experiments/precision_mismatch/full_s{1,2,3} \
        --results experiments/results/precision_mismatch.json   # the deciding run: S = 1, 2, 3

Samples SmolLM2-135M-Instruct answers to 1-digit addition questions with vLLM
(CPU build) and with the JAX sampler at float32, bfloat16 and float16, then
recomputes their logprobs with the learner at fp32, bf16 and fp16. Writes to
runs/experiments/precision_mismatch/<quick|full>/: mismatch.json, summary.md,
prob_scatter.png, seq_log_ratio_vs_length.png, kl_grid.png, run_info.json.
GPU scale: see experiments/README.md.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Sequence

from jaxrl_llm.reports import stats
from jaxrl_llm.reports.precision import ENGINES, PrecisionStudy, matched_ratios, run_study
from jaxrl_llm.reports.runs import experiment_parser, output_dir, write_summary

NAME = "precision_mismatch"
FULL = PrecisionStudy(prompts=32, samples=8, max_tokens=128)
QUICK = PrecisionStudy(prompts=8, samples=4, max_tokens=64)
# GPU scale (launch/README.md): a 1.5B math model on MATH prompts, vLLM on a GPU.
GPU = PrecisionStudy(model="/data/Qwen2.5-Math-1.5B", prompts=256, samples=8, max_tokens=3000)
SIZES = {"": FULL, "quick": QUICK, "gpu": GPU}


def get_config(arg: str = "") -> PrecisionStudy:
    """ARG = "" (CPU full size), "quick" or "gpu": the study's settings (not a `jaxrl train`
    config: this experiment samples and scores, it does not train)."""
    if arg not in SIZES:
        raise ValueError(f"experiments/precision_mismatch.py:{arg} is invalid; valid: one of {tuple(SIZES)}")
    return SIZES[arg]



# ------------------------------------------------------------- the verdict rule (issue 36)
CLAIM = "FP16 cuts the sampler-learner mismatch by an order of magnitude against BF16 (Qi et al. 2025, arXiv 2510.26788)"
VERDICT_RULE = ("k3 per token, bf16 / fp16 ratio of matched sampler-learner pairs, per sampling seed; 95% Student-t "
                "interval of log(ratio) over seeds, exponentiated: reproduced if its lower end is >= 10 for both "
                "engines, not reproduced if either upper end is < 10, otherwise inconclusive")
RATIO_KEYS = ("vllm k3 bf16/fp16", "jax k3 bf16/fp16")


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored ratio intervals."""
    from jaxrl_llm.reports.results import number

    ivs = [number(numbers, k) for k in RATIO_KEYS if k in numbers]
    if len(ivs) < len(RATIO_KEYS) or any(iv.n < 2 for iv in ivs):
        return "inconclusive"
    if any(iv.high < 10 for iv in ivs):
        return "not reproduced"
    return "reproduced" if all(iv.low >= 10 for iv in ivs) else "inconclusive"


# ------------------------------------------------------------- the deciding run's result
STATISTICS = ("k3", "k1", "max_abs_logprob_diff")


def deciding_result(rows: dict[int, list[dict]], *, setting: str, command: str, wall_s: float | None,
                    notes: Sequence[str] = (), wall_note: str = ""):
    """The stored result (reports/results.py) from each sampling seed's rows ({seed: the
    `rows` of its mismatch.json}). The bf16 / fp16 ratios of matched pairs: geometric mean
    and log-scale interval per engine and statistic; VERDICT_RULE reads the k3 ones. k1 (a
    mean of signed log-ratios) can be <= 0 in a seed; then its ratio has no logarithm and
    is kept per seed only. Each matched pair's own k1, k3 and sequence log-ratio slope per
    token (the paper's drift with length): mean and Student-t interval over seeds."""
    from jaxrl_llm.reports.results import ExperimentResult, keyed

    seeds = tuple(sorted(rows))
    ratios = {s: matched_ratios(rows[s]) for s in seeds}
    numbers, per_seed, extra = {}, {}, []
    for engine in ("vllm", "jax"):
        for statistic in STATISTICS:
            key = f"{engine} {statistic} bf16/fp16"
            values = {s: ratios[s][engine][statistic] for s in seeds if engine in ratios[s]}
            if not values:
                continue
            per_seed[key] = keyed(values)
            if all(v > 0 for v in values.values()):
                numbers[key] = stats.log_interval(list(values.values())).to_dict()
            else:
                extra.append(f"{key}: a seed's ratio is <= 0 (k1 of either sign), no log interval")
    matched = {s: {r["sampler"]: r for r in rows[s] if r["matched"]} for s in seeds}
    for sampler in sorted({name for m in matched.values() for name in m}, key=_sampler_order):
        for statistic in ("k1", "k3", "seq_log_ratio_length_slope"):
            values = {s: matched[s][sampler][statistic] for s in seeds if sampler in matched[s]}
            per_seed[f"{sampler} matched {statistic}"] = keyed(values)
            numbers[f"{sampler} matched {statistic}"] = stats.interval(list(values.values())).to_dict()
    return ExperimentResult(
        name=NAME, title="precision mismatch (vLLM CPU and JAX sampler x learner, fp32/bf16/fp16)", claim=CLAIM,
        setting=setting, command=command, seeds=seeds,
        statistic="k3 per token, bf16 / fp16 ratio of matched sampler-learner pairs",
        interval_method="geometric mean over sampling seeds, 95% Student-t interval of log(ratio), exponentiated",
        verdict_rule=VERDICT_RULE, verdict=rule_verdict(numbers), numbers=numbers,
        headline=next((k for k in RATIO_KEYS if k in numbers), next(iter(numbers), "")),
        per_seed=per_seed, wall_s=wall_s, wall_note=wall_note, notes=tuple(notes) + tuple(extra))


def _sampler_order(sampler: str) -> tuple[int, int]:
    """"vllm:bf16" -> vLLM before JAX, then fp32, bf16, fp16 (the tables' order)."""
    engine, dtype = sampler.split(":")
    engine_rank = ("vllm", "jax").index(engine) if engine in ("vllm", "jax") else 2
    return engine_rank, ("fp32", "bf16", "fp16").index(dtype)


def _run_commit(run_dir: str) -> str | None:
    """The commit a run's run_info.json names (None without one)."""
    path = Path(run_dir) / "run_info.json"
    return json.loads(path.read_text()).get("git_commit") if path.is_file() else None


def collect(run_dirs: Sequence[str], results: str | None) -> int:
    """Reads each run directory's mismatch.json (one sampling seed each), prints the ratios
    and, with `results`, writes the stored result."""
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.results_table import duration

    runs = {}
    for d in run_dirs:
        path = Path(d) / "mismatch.json"
        if not path.is_file():
            raise SystemExit(f"--collect {d}: no mismatch.json there; valid: a finished run's --out directory")
        data = json.loads(path.read_text())
        seed = int(data["study"]["seed"])
        if seed in runs:
            raise SystemExit(f"--collect: seed {seed} appears twice ({runs[seed][0]} and {d}); valid: one run per seed")
        runs[seed] = (d, data)
    studies = {json.dumps({k: v for k, v in data["study"].items() if k != "seed"}, sort_keys=True)
               for _, data in runs.values()}
    if len(studies) != 1:
        raise SystemExit(f"--collect: the runs differ in more than the seed: {sorted(studies)}")
    study = next(iter(runs.values()))[1]["study"]
    walls = [runs[s][1].get("wall_s") for s in sorted(runs)]
    wall_s = float(sum(walls)) if all(w is not None for w in walls) else None
    wall_note = (f"{len(runs)} seeds in turn: " + " + ".join(duration(w) for w in walls)) if wall_s else ""
    result = deciding_result(
        {s: data["rows"] for s, (_, data) in runs.items()},
        setting=(f"{study['prompts']} prompts x {study['samples']} samples, <= {study['max_tokens']} tokens, "
                 f"temperature {study['temperature']}, {Path(study['model']).name or study['model']}, "
                 f"engines {','.join(study['engines'])}"),
        command=(f"python experiments/precision_mismatch.py --out <dir> seed=S for S in {sorted(runs)}; "
                 f"--collect the {len(runs)} directories"),
        wall_s=wall_s, wall_note=wall_note,
        notes=[f"seed {s}: {d}, commit {_run_commit(d)}, wall {data.get('wall_s')} s, "
               f"load at its end {data.get('load_average')}" for s, (d, data) in sorted(runs.items())])
    for key, iv in result.numbers.items():
        print(f"{key}: {stats.format_interval(stats.Interval(**iv))}")
    print(f"verdict: {result.verdict} (n = {len(runs)})")
    if results:
        print(f"wrote {write_result(result, results)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = experiment_parser(__doc__, name=NAME, results=True)
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated subset of jax,vllm")
    parser.add_argument("--model", default=None, help="HF directory (default: smollm2)")
    parser.add_argument("--collect", nargs="+", default=None, metavar="DIR",
                        help="aggregate finished runs (one sampling seed each) instead of running; "
                             "with --results also write the stored result")
    args = parser.parse_args(argv)
    if args.collect:
        return collect(args.collect, args.results)
    if args.results:
        parser.error("--results needs --collect: one run is one sampling seed; the stored result "
                     "aggregates the seeds' --out directories")
    start = time.monotonic()
    study = get_config("quick" if args.quick else "")
    fields = {f.name: f.type for f in dataclasses.fields(PrecisionStudy)}
    for item in args.overrides:  # e.g. prompts=2 samples=2 max_tokens=8
        key, _, value = item.partition("=")
        if key not in fields or fields[key] != "int":
            raise SystemExit(f"override {item!r}: valid keys are prompts, samples, max_tokens, seed (integers)")
        study = dataclasses.replace(study, **{key: int(value)})
    study = dataclasses.replace(study, engines=tuple(e for e in args.engines.split(",") if e),
                                **({"model": args.model} if args.model else {}))
    out = output_dir(args, NAME)
    result = run_study(study, out)
    (out / "mismatch.json").write_text(json.dumps({"study": dataclasses.asdict(study), **result,
                                                   "wall_s": round(time.monotonic() - start, 1),
                                                   "load_average": [round(x, 2) for x in os.getloadavg()]},
                                                  indent=2) + "\n")

    ratios = matched_ratios(result["rows"])
    notes = [f"bf16/bf16 over fp16/fp16, {engine}: k1 x{r['k1']:.1f}, k3 x{r['k3']:.1f}, "
             f"max|dlogp| x{r['max_abs_logprob_diff']:.1f} (paper: KL ~24x)" for engine, r in ratios.items()]
    notes += [f"unavailable: {label}: {why}" for label, why in result["unsupported"].items()]
    notes.append(f"seeds: 1 (sampling seed {study.seed}): no interval; the KL values are means over the "
                 f"sampled tokens of one seed")
    notes += [f"sampling speed {label}: {t['tokens_per_s']:.0f} tok/s ({t['tokens']} tokens)"
              for label, t in result["timings"].items()]
    write_summary(out, result["rows"], ["sampler", "learner", "matched", "tokens", "k1", "k3", "prob_diff_max",
                                        "prob_diff_min", "max_abs_logprob_diff", "seq_log_ratio_length_slope",
                                        "seq_log_ratio_mean"],
                  title=f"Precision mismatch ({'quick' if args.quick else 'full'})", notes=notes,
                  config={"name": NAME, "quick": args.quick, "study": dataclasses.asdict(study),
                          "vllm_version": result["vllm_version"]})
    print(f"wrote {out}/prob_scatter.png, seq_log_ratio_vs_length.png, kl_grid.png, summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
