"""Experiment 10: off-policy corrections under staleness and a low-precision sampler (issue 48).

Question: when the batch is off-policy, because it was sampled by weights up to
`rollout.max_lag` versions old (asynchronous rollouts) and/or by a bfloat16 sampler while
the learner computes pi_old in float32, which of the corrections the peers ship keeps
training on track? Corrections (`recipe.correction`, core/corrections.py, core/off_policy.py,
docs/objectives.md#mismatch-corrections), each with its own default bounds:

  none           no correction at all (recipe.correction=off; the async loop's default token
                 TIS against staleness is off too)
  token_tis      truncated IS per token, min(pi_old/mu, C), C = 2       (Yao et al. 2025)
  token_mis      IcePop's token mask: pi_old/mu outside [0.5, 5] dropped (IcePop, Ling Team 2025)
  sequence_mis   rho_i = prod pi_old/mu, sequences with rho_i > 10 dropped (Qi et al. 2025)
  seq_mask_tis   token weights pi_old/mu, sequences whose geometric-mean ratio leaves
                 [0.999, 1.002] dropped                                  (NeMo-RL's seq-mask-tis)
  decoupled_ppo  pi_prox/mu weights, 0 above 5, behaviour / proximal / current policies
                                                                         (AReaL, Fu et al. 2025, arXiv 2505.24298)

Grid: rollout.max_lag in {0, 2, 4} x sampler precision (model.compute_dtype: float32 "fp32",
bfloat16 "bf16"; the learner is float32) x the 6 corrections x 3 seeds = 108 runs.

Setting (CPU-sized, all 108 runs in one process so the compiled functions are reused): the
tiny learning setup of the tests (tests/train/learning_setup.py, rebuilt here): a random
2-layer width-32 decoder over SmolLM2's tokenizer with embeddings 25x the usual init (a
peaked next-token distribution), the addition task's prompts scored by the share of the
(at most MAX_TOKENS) completion tokens that start a word. A sample *succeeds* when every
token starts a word (reward 1, `SUCCESS_THRESHOLD`); the random policy succeeds on a few
percent. GRPO, JAX sampler at temperature 1, 2 prompts x 8 samples per step, lr 1e-2,
STEPS steps; held-out success = pass@1 over EVAL_PROMPTS held-out prompts x EVAL_SAMPLES
samples at the last step. The model seed is fixed (0); the run seed varies the prompts and
the sampling. Seed 0 was used once to size the run (lag 2, fp32, none and token_tis, 8 steps,
one process, load 0.7-1.5: 22 s for the first run with its compilation, 9 s for the next; success
rose 0.19 -> ~0.5 in training, held-out 0.69): a tuning seed, not in SEEDS. STEPS = 10 and 16
held-out prompts were fixed from that, before the grid ran.

Per run: held-out success at the end; steps to threshold (first step whose training success
rate >= STEP_THRESHOLD; STEPS + 1 when never); collapse (COLLAPSE_RULE); mismatch k3 over
the steps (mean and max of the loop's `mismatch_k3`, pi_old against the sampler's log-probs).

Rules, fixed here before the run:
COLLAPSE_RULE and VERDICT_RULE below (equivalence margin MARGIN). The stored result's
overall verdict answers the claim for the most off-policy cell (max_lag 4, bf16).

    python experiments/off_policy.py                       # the full grid: 108 runs, resumable
    python experiments/off_policy.py --quick               # 2 corrections x lag 2 x fp32 x 1 seed x 2 steps
    python -m jaxrl_llm.reports.off_policy_table           # experiments/results/off_policy.md from the JSON

Writes runs/experiments/off_policy/<quick|full>/runs.jsonl (one line per finished run; a rerun
skips those) and, after every run, experiments/results/off_policy.json (`--results` elsewhere)
and the per-cell table experiments/results/off_policy.md.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from jaxrl_llm.rewards import trusted_in_process

NAME = "off_policy"
REPO = Path(__file__).resolve().parents[1]
LAGS = (0, 2, 4)
PRECISIONS = {"fp32": "float32", "bf16": "bfloat16"}
CORRECTIONS = ("none", "token_tis", "token_mis", "sequence_mis", "seq_mask_tis", "decoupled_ppo")
SEEDS = (1, 2, 3)
TUNING_SEEDS = (0,)
STEPS = 10
MAX_TOKENS = 6
EMBED_SCALE = 25.0
SUCCESS_THRESHOLD = 1.0
STEP_THRESHOLD = 0.5
EVAL_PROMPTS, EVAL_SAMPLES = 16, 4
LEDGER_COMMAND = "nice -n 5 timeout 3600 python experiments/off_policy.py"  # what ran the full grid
FIRST_GRID_COMMIT = "a2b2ea7"  # the ledger rows written before rows carried their commit ran at this one
QUICK = {"lags": (2,), "precisions": ("fp32",), "corrections": ("none", "token_tis"), "seeds": (1,), "steps": 2}

# ------------------------------------------------------------ the rules (fixed before the run)
COLLAPSE_PEAK, COLLAPSE_FLOOR = 0.5, 0.1
COLLAPSE_RULE = (f"a run has collapsed when its loss or gradient norm is non-finite at any step, or when its "
                 f"training success rate reached >= {COLLAPSE_PEAK} at some step and its held-out success at "
                 f"the end is < {COLLAPSE_FLOOR}")
MARGIN = 0.1
VERDICT_RULE = (
    "per (max_lag, sampler precision) cell, corrections are ranked by mean held-out success at the end over the "
    "seeds (95% Student-t interval); each correction is compared with `none` by the paired per-seed difference "
    "of end success, 95% Student-t over seeds: 'helps' if the interval lies above 0, 'hurts' if below 0, "
    f"'equivalent' if it lies inside [-{MARGIN}, +{MARGIN}] (the equivalence margin), else 'inconclusive'; a "
    "collapsed run counts with its end success (no exclusion). Overall (the claim, cell max_lag 4 / bf16): "
    "reproduced if some correction helps there; not reproduced if every correction is equivalent or hurts "
    "there; otherwise inconclusive")
CLAIM = ("on stale (max_lag 4), bf16-sampled batches some off-policy correction (token TIS, IcePop's token MIS, "
         "sequence MIS, sequence-masked TIS, decoupled PPO) keeps end success above no correction "
         "(Yao et al. 2025; IcePop; NeMo-RL; Fu et al. 2025, arXiv 2505.24298)")


class Cell(NamedTuple):
    lag: int
    precision: str


def run_key(lag: int, precision: str, correction: str, seed: int) -> str:
    return f"lag{lag}_{precision}_{correction}_s{seed}"


# ------------------------------------------------------------ the setting
def tiny_model(out: Path, seed: int = 0) -> str:
    """The tiny decoder (models.config.tiny_decoder_config) from PRNGKey(seed), its token
    embeddings scaled by EMBED_SCALE so the next-token distribution is peaked; saved once as an
    HF directory with SmolLM2's tokenizer."""
    if (out / "config.json").exists():
        return str(out)
    import jax

    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config()
    params = init_params(cfg, jax.random.key(seed))
    params = {**params, "embed": params["embed"] * EMBED_SCALE}
    bridge.save_hf_dir(cfg, params, out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


@trusted_in_process
def word_start_share(completion: str, example) -> float:
    """Share of the completion's (at most MAX_TOKENS) tokens that start a word."""
    return min(completion.count(" "), MAX_TOKENS) / MAX_TOKENS


def make_task():
    """The addition task's prompts, scored by `word_start_share`; success = every token starts a word."""
    from jaxrl_llm.data import Task, make_task as make_named_task

    class WordStartTask(Task):
        name = "word_starts"
        heldout_fraction = 0.3
        correct_threshold = SUCCESS_THRESHOLD

        def __init__(self):
            self._prompts = make_named_task("addition", digits=1)
            self.reward_fn = word_start_share

        def examples(self, split: str, n: int, *, seed: int, unique: bool = False):
            return self._prompts.examples(split, n, seed=seed, unique=unique)

    return WordStartTask()


def get_config(arg: str = "lag4_bf16_none", seed: int = SEEDS[0], model_dir: str = "", run_dir: str = "",
               steps: int = STEPS):
    """ARG = lag<L>_<fp32|bf16>_<correction>: one run of the grid."""
    from jaxrl_llm.train.config import ConfigError, load_config

    try:
        lag_s, precision, correction = arg.split("_", 2)
        lag = int(lag_s.removeprefix("lag"))
    except ValueError:
        raise ConfigError(f"experiments/off_policy.py:{arg} is invalid; valid: lag<L>_<fp32|bf16>_<correction>, "
                          f"e.g. lag4_bf16_token_tis") from None
    if precision not in PRECISIONS or correction not in CORRECTIONS:
        raise ConfigError(f"experiments/off_policy.py:{arg}: precision {precision!r} / correction {correction!r} "
                          f"is invalid; valid: precision in {tuple(PRECISIONS)}, correction in {CORRECTIONS}")
    return load_config(str(REPO / "experiments/demo.py"), [
        f"name={NAME}_{arg}", f"seed={seed}", f"total_steps={steps}", f"model.source={model_dir or 'smollm2'}",
        f"model.compute_dtype={PRECISIONS[precision]}", "train.precision=fp32", "recipe.name=grpo",
        f"recipe.correction={'off' if correction == 'none' else correction}", f"rollout.max_lag={lag}",
        "rollout.engine=jax", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=8",
        f"rollout.max_tokens={MAX_TOKENS}", "train.micro_batch_size=16", "train.lr=1e-2",
        f"task.eval_size={EVAL_PROMPTS}", f"task.eval_samples={EVAL_SAMPLES}", f"task.eval_every={steps}",
        f"checkpoint.every_steps={steps}", "checkpoint.keep=1", "checkpoint.async_save=false",
        "metrics.tensorboard=false", f"metrics.progress_every={steps}",
        *([f"run_dir={run_dir}"] if run_dir else [])])


# ------------------------------------------------------------ one run's numbers
def finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


def run_row(metrics: Sequence[Mapping], evals: Sequence[Mapping], steps: int) -> dict:
    """One run's numbers from its metrics.jsonl rows and eval.jsonl records (COLLAPSE_RULE)."""
    rates = [float(r.get("pass_rate", float("nan"))) for r in metrics]
    end = float(evals[-1]["pass@1"]) if evals else float("nan")
    reached = [i + 1 for i, p in enumerate(rates) if p >= STEP_THRESHOLD]
    k3 = [float(r["mismatch_k3"]) for r in metrics if finite(r.get("mismatch_k3"))]
    nonfinite = any(not finite(r.get(k)) for r in metrics for k in ("loss", "grad_norm") if k in r)
    peaked = any(p >= COLLAPSE_PEAK for p in rates)
    return {"end_success": end, "steps_to_threshold": reached[0] if reached else steps + 1,
            "collapsed": bool(nonfinite or (peaked and not end >= COLLAPSE_FLOOR)),
            "k3_mean": float(np.mean(k3)) if k3 else float("nan"), "k3_max": float(np.max(k3)) if k3 else float("nan"),
            "final_train_success": rates[-1] if rates else float("nan"), "steps": len(metrics)}


def train_one(cfg, policy, task) -> dict:
    """Trains `cfg` (fresh run directory) and returns its `run_row`."""
    from jaxrl_llm.train.run import loop
    from jaxrl_llm.train.run.metrics import read_metrics

    loop.train(cfg, task=task, policy=policy)
    run = Path(cfg.run_path)
    evals = [json.loads(x) for x in (run / "eval.jsonl").read_text().splitlines() if x.strip()]
    return run_row(read_metrics(run), evals, cfg.total_steps)


# ------------------------------------------------------------ the rule on the numbers
def label(diff) -> str:
    """VERDICT_RULE's reading of one paired correction - none interval (reports.stats.Interval)."""
    if diff.n < 2 or not math.isfinite(diff.low):
        return "inconclusive"
    if diff.low > 0:
        return "helps"
    if diff.high < 0:
        return "hurts"
    if -MARGIN <= diff.low and diff.high <= MARGIN:
        return "equivalent"
    return "inconclusive"


def cell_numbers(runs: Mapping[str, Mapping], cell: Cell, corrections: Sequence[str], seeds: Sequence[int]) -> dict:
    """{correction: {"end": interval, "diff": paired interval to none or None, "label", per-run means}} of a cell,
    over the seeds for which both the correction's and none's runs exist."""
    from jaxrl_llm.reports import stats

    out = {}
    for c in corrections:
        have = [s for s in seeds if run_key(cell.lag, cell.precision, c, s) in runs]
        vals = {s: runs[run_key(cell.lag, cell.precision, c, s)] for s in have}
        if not vals:
            continue  # not run (yet): no entry, so an unfinished grid gives no reading for it
        row = {"end": stats.interval([v["end_success"] for v in vals.values()]),
               "steps_to_threshold": stats.interval([v["steps_to_threshold"] for v in vals.values()]),
               "k3_mean": stats.interval([v["k3_mean"] for v in vals.values()]),
               "k3_max": max((v["k3_max"] for v in vals.values()), default=float("nan")),
               "collapsed": sum(v["collapsed"] for v in vals.values()), "n": len(vals)}
        if c != "none":
            paired = [vals[s]["end_success"] - runs[run_key(cell.lag, cell.precision, "none", s)]["end_success"]
                      for s in have if run_key(cell.lag, cell.precision, "none", s) in runs]
            row["diff"] = stats.interval(paired)
            row["label"] = label(row["diff"])
        out[c] = row
    return out


def diff_key(cell: Cell, correction: str) -> str:
    return f"lag{cell.lag} {cell.precision}: {correction} - none end success"


def overall(labels: Sequence[str]) -> str:
    """The claim's verdict from the labels of the corrections in the cell max_lag 4 / bf16."""
    if not labels:
        return "no verdict"
    if "helps" in labels:
        return "reproduced"
    if all(x in ("equivalent", "hurts") for x in labels):
        return "not reproduced"
    return "inconclusive"


CLAIM_CELL = Cell(4, "bf16")


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored paired intervals of the claim's cell."""
    from jaxrl_llm.reports.results import number

    keys = [diff_key(CLAIM_CELL, c) for c in CORRECTIONS[1:] if diff_key(CLAIM_CELL, c) in numbers]
    return overall([label(number(numbers, k)) for k in keys])


def build_result(runs: Mapping[str, Mapping], *, seeds: Sequence[int], lags=LAGS, precisions=tuple(PRECISIONS),
                 corrections=CORRECTIONS, command: str, wall_s: float | None, steps: int = STEPS, notes=()):
    """The stored result (reports/results.py): every cell's paired intervals in `numbers`, every run's
    numbers in `per_seed` ("<run key without seed> <quantity>": {seed: value})."""
    from jaxrl_llm.reports.results import ExperimentResult

    numbers, per_seed = {}, {}
    for lag in lags:
        for p in precisions:
            cell = Cell(lag, p)
            for c, row in cell_numbers(runs, cell, corrections, seeds).items():
                numbers[f"lag{lag} {p}: {c} end success"] = row["end"].to_dict()
                if "diff" in row:
                    numbers[diff_key(cell, c)] = row["diff"].to_dict()
    for key, row in runs.items():
        name, seed = key.rsplit("_s", 1)
        for q in ("end_success", "steps_to_threshold", "collapsed", "k3_mean", "k3_max", "final_train_success"):
            per_seed.setdefault(f"{name} {q}", {})[seed] = float(row[q])
    claim_keys = [diff_key(CLAIM_CELL, c) for c in corrections[1:] if diff_key(CLAIM_CELL, c) in numbers]
    headline = max(claim_keys, key=lambda k: numbers[k]["mean"]) if claim_keys else ""
    return ExperimentResult(
        name=NAME, title="off-policy corrections x staleness x sampler precision (tiny decoder, word-start task)",
        claim=CLAIM, setting=(f"tiny decoder (2 layers, width 32, embeddings x{EMBED_SCALE}), word-start task, GRPO, "
                              f"JAX sampler, 2 prompts x 8 samples, {MAX_TOKENS} tokens, lr 1e-2, {steps} steps, "
                              f"max_lag {list(lags)} x sampler {list(precisions)} x {list(corrections)}; "
                              f"held-out pass@1 on {EVAL_PROMPTS} x {EVAL_SAMPLES}"),
        command=command, seeds=tuple(seeds), tuning_seeds=tuple(s for s in TUNING_SEEDS if s not in seeds),
        statistic="held-out success at the end; paired correction - none per cell",
        interval_method="mean and 95% Student-t over seeds", verdict_rule=VERDICT_RULE,
        exclusion_rule="none: every seed counts; collapsed runs are counted and reported: " + COLLAPSE_RULE,
        verdict=rule_verdict(numbers) if claim_keys else "no verdict", headline=headline, numbers=numbers,
        per_seed=per_seed, wall_s=wall_s, notes=tuple(notes))


# ------------------------------------------------------------ the runner
def read_done(path: Path) -> dict[str, dict]:
    if not path.exists():
        return {}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return {r["key"]: r for r in rows}


def grid(lags, precisions, corrections, seeds) -> list[tuple[int, str, str, int]]:
    """Seed-major order, so that a cut run has whole seeds of every cell first."""
    return [(lag, p, c, s) for s in seeds for lag in lags for p in precisions for c in corrections]


def parse(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 corrections x lag 2 x fp32 x 1 seed x 2 steps")
    parser.add_argument("--out", type=Path, default=None, help="default runs/experiments/off_policy/<quick|full>")
    parser.add_argument("--results", type=Path, default=None,
                        help="result JSON (default experiments/results/off_policy.json; --quick: <out>/result.json)")
    parser.add_argument("--seeds", type=lambda s: tuple(int(x) for x in s.split(",")), default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--store-only", action="store_true",
                        help="rewrite the result JSON and table from the finished runs of the ledger; train nothing")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    import logging

    from jaxrl_llm.reports.results import code_version
    from jaxrl_llm.train.policy import load_policy

    start = time.perf_counter()
    args = parse(argv)
    code_version()  # the commit that runs, read once now
    logging.basicConfig(level=logging.WARNING)
    q = QUICK if args.quick else {"lags": LAGS, "precisions": tuple(PRECISIONS), "corrections": CORRECTIONS,
                                  "seeds": SEEDS, "steps": STEPS}
    seeds, steps = args.seeds or q["seeds"], args.steps or q["steps"]
    out = args.out or REPO / "runs/experiments" / NAME / ("quick" if args.quick else "full")
    results = args.results or (out / "result.json" if args.quick else REPO / f"experiments/results/{NAME}.json")
    out.mkdir(parents=True, exist_ok=True)
    ledger = out / "runs.jsonl"
    done = read_done(ledger)
    command = "python experiments/off_policy.py " + shlex.join(sys.argv[1:] if argv is None else list(argv))
    if args.store_only:
        store(done, q, seeds, steps, command if args.quick else LEDGER_COMMAND, results)
        return 0
    model_dir = tiny_model(out / "model")
    policy, task = load_policy(model_dir), make_task()
    for lag, p, c, s in grid(q["lags"], q["precisions"], q["corrections"], seeds):
        key = run_key(lag, p, c, s)
        if key in done:
            continue
        t0 = time.perf_counter()
        cfg = get_config(f"lag{lag}_{p}_{c}", s, model_dir, run_dir=str(out / key), steps=steps)
        row = {"key": key, **train_one(cfg, policy, task), "wall_s": time.perf_counter() - t0,
               "load_average": [round(x, 2) for x in os.getloadavg()], "commit": code_version()[0]}
        with ledger.open("a") as f:
            f.write(json.dumps(row) + "\n")
        done[key] = row
        print(f"{key}: end {row['end_success']:.3f} k3 {row['k3_mean']:.2e} {row['wall_s']:.1f} s", flush=True)
        store(done, q, seeds, steps, command, results)
    store(done, q, seeds, steps, command, results)
    print(f"wrote {results} in {time.perf_counter() - start:.0f} s")
    return 0


def store(done: Mapping[str, dict], q: Mapping, seeds, steps: int, command: str, results: Path) -> None:
    """Writes the result JSON and its table from the finished runs `done` (the ledger's rows)."""
    from jaxrl_llm.reports.off_policy_table import write_table
    from jaxrl_llm.reports.results import write_result

    total = len(q["lags"]) * len(q["precisions"]) * len(q["corrections"]) * len(seeds)
    loads = [r["load_average"][0] for r in done.values() if r.get("load_average")]
    commits = sorted({str(r.get("commit", FIRST_GRID_COMMIT))[:7] for r in done.values()})
    notes = (f"{len(done)} of {total} runs finished", f"runs ran at commit(s) {', '.join(commits)}",
             f"1-min load average at the end of each run: {min(loads, default=0):.2f} to {max(loads, default=0):.2f}, "
             f"mean {np.mean(loads) if loads else 0:.2f}",
             "wall time: the sum of the runs' own wall times (their compilations included)")
    result = build_result(done, seeds=seeds, lags=q["lags"], precisions=q["precisions"],
                          corrections=q["corrections"], command=command,
                          wall_s=sum(r["wall_s"] for r in done.values()), steps=steps, notes=notes)
    write_table(write_result(result, results))


if __name__ == "__main__":
    raise SystemExit(main())
