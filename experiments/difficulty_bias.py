"""Experiment 3: difficulty bias of std-normalised advantages.

Question (Liu et al. 2025, Dr. GRPO, arXiv 2503.20783, section 3.1): for binary
rewards, dividing the group-centred advantage by the group's std re-weights
prompts by 1/std: how does the per-prompt gradient weight depend on the
group's success rate p, analytically and in the groups of a real run?

    python experiments/difficulty_bias.py --quick --seeds 201,202,203 --results experiments/results/difficulty_bias.json
    python experiments/difficulty_bias.py --runs RUN_DIR ...    # measure existing runs (each one replicate)
    jaxrl train --config experiments/difficulty_bias.py:gpu    # GPU-scale run to measure

Without --runs it samples, per seed, BATCHES batches of 8 prompts x 8 samples (32 tokens, temperature 1,
JAX engine) from the base SmolLM2-135M-Instruct, grades them with the task's reward and logs them as
<out>/base_s<seed>/groups.jsonl: the groups a GRPO step would train on at its start. The measured
weights are the recipes' real losses differentiated on those groups; no parameter update is needed
for them (a first launch trained a GRPO run per seed instead: 200 s per step at load 11-15 and killed
by the kernel's OOM killer at 7.7 GB, so the groups come from the sampler alone). A seed is one
replicate; VERDICT_RULE reads the interval over seeds. Writes to
runs/experiments/difficulty_bias/<quick|full>/: base_s<seed>/groups.jsonl, difficulty_bias.png (all
seeds' groups), summary.md / .json, run_info.json.
"""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from typing import Mapping, Sequence

from base_configs import addition_config
from jaxrl_llm.train.config import Config

NAME = "difficulty_bias"
QUICK = ("total_steps=6", "rollout.prompts_per_step=4")
BATCHES, QUICK_BATCHES = 6, 3  # sampled batches of 8 prompts x 8 samples per seed
# Fresh seeds (issue 51): the recorded result pooled experiment 1's seed-0 groups and the old default was 1.
SEEDS = QUICK_SEEDS = (201, 202, 203)


def get_config(arg: str = "", seed: int = SEEDS[0]) -> Config:
    """ARG = "" (CPU) or "gpu". A GRPO run whose groups are measured."""
    return addition_config(f"{NAME}_grpo", "" if arg == "cpu" else arg, recipe="grpo", total_steps=30,
                           max_tokens=32, seed=seed)



# ------------------------------------------------------------- the verdict rule (issue 51, fixed before the run)
CLAIM = "the group-std normaliser up-weights too-easy and too-hard prompts (Liu et al. 2025, arXiv 2503.20783)"
IDENTITY_TOL = 1e-4
MIN_SEEDS = 3
EDGE_KEY = "gradient share with / without std, p in {1/8, 7/8}"
IDENTITY_KEY = "max |measured - closed form| E|A|"
VERDICT_RULE = (
    f"per seed (its sampled groups of G = 8 from the base policy): the mean over its groups at p = 1/8 or 7/8 of the group's "
    f"gradient share with the std normaliser / without it (same step, same loss otherwise); a seed without such a "
    f"group is not measured. Not reproduced if the measured E|A| of some group differs from the closed form by "
    f">= {IDENTITY_TOL:g} (the measurement is wrong). Else, over the measured seeds (95% Student-t): reproduced if "
    f"the interval of the share ratio lies above 1, not reproduced if it lies below 1, inconclusive if it covers 1 "
    f"or fewer than {MIN_SEEDS} seeds were measured")


def rule_verdict(numbers: Mapping) -> str:
    """VERDICT_RULE on the stored numbers (reports.results.number)."""
    from jaxrl_llm.reports.results import number

    if not number(numbers, IDENTITY_KEY).mean < IDENTITY_TOL:
        return "not reproduced"
    edge = number(numbers, EDGE_KEY)
    if edge.n < MIN_SEEDS:
        return "inconclusive"
    return "reproduced" if edge.low > 1 else "not reproduced" if edge.high < 1 else "inconclusive"


def seed_numbers(result: Mapping, group_size: int) -> dict[str, float]:
    """One seed's numbers from `difficulty.measure` of its groups: the largest gap between a
    group's measured E|A| and the closed form (both estimators), the edge groups' share ratio
    (count-weighted over p = 1/G and (G-1)/G; nan without such a group) and the middle's (p = 1/2)."""
    from jaxrl_llm.reports import difficulty

    gap = max(float(abs(result["mean_abs_adv"][name] - difficulty.analytic_weight(
        result["success"], group_size, std_normalised=std)).max()) for name, std in
        (("std (GRPO)", True), ("no std (Dr. GRPO advantage)", False)))
    by_p = {round(r["p"] * group_size): r for r in result["rows"]}

    def ratio(levels):
        rows = [by_p[k] for k in levels if by_p[k]["groups"] and math.isfinite(by_p[k]["share ratio std/no_std"])]
        count = sum(r["groups"] for r in rows)
        return sum(r["groups"] * r["share ratio std/no_std"] for r in rows) / count if count else math.nan

    return {IDENTITY_KEY: gap, EDGE_KEY: ratio((1, group_size - 1)),
            "gradient share with / without std, p = 1/2": ratio((group_size // 2,)),
            "groups at p in {1/8, 7/8}": float(sum(by_p[k]["groups"] for k in (1, group_size - 1))),
            "groups": float(sum(r["groups"] for r in result["rows"]))}


def build_result(per_seed: Mapping[int, Mapping[str, float]], *, command: str, setting: str, wall_s: float,
                 notes: Sequence[str] = ()):
    """The stored result of {seed: seed_numbers(...)}: intervals over seeds (the identity gap: the
    largest over seeds, n = every group), verdict by VERDICT_RULE."""
    from jaxrl_llm.reports.results import ExperimentResult, interval_of, keyed

    keys = list(next(iter(per_seed.values())))
    stored = {k: keyed({s: v[k] for s, v in per_seed.items()}) for k in keys}
    numbers = {k: interval_of(stored[k]).to_dict() for k in keys}
    groups = int(sum(v["groups"] for v in per_seed.values()))
    numbers[IDENTITY_KEY] = {"mean": max(v[IDENTITY_KEY] for v in per_seed.values()), "low": math.nan,
                             "high": math.nan, "n": groups}
    return ExperimentResult(
        name=NAME, title="difficulty bias (analytic + real groups)", claim=CLAIM, setting=setting, command=command,
        seeds=tuple(per_seed), statistic="per seed: gradient share of the p = 1/8 and 7/8 groups with / without the "
        "std normaliser (from the loss gradient); measured vs closed-form E|A| on every group",
        interval_method="mean and 95% Student-t over seeds (the identity gap: the largest over all groups)",
        verdict_rule=VERDICT_RULE, verdict=rule_verdict(numbers), headline=EDGE_KEY, numbers=numbers,
        per_seed=stored, wall_s=wall_s, notes=tuple(notes))


def sample_groups(cfg: Config, policy, batches: int, path: Path) -> Path:
    """`batches` batches of cfg.rollout.prompts_per_step training prompts x samples_per_prompt samples
    from `policy`'s own weights (cfg's sampling settings, seeded by cfg.seed and the batch), graded by
    the task's reward; written as `path`/groups.jsonl (the training loop's GroupLog format) and kept
    when it already holds them all."""
    import contextlib
    import json

    import numpy as np

    from jaxrl_llm.rewards import GraderPool
    from jaxrl_llm.train.policy import decode_completions, encode_prompts
    from jaxrl_llm.train.sample.engines import engine_spec, make_engine, sampling_params
    from jaxrl_llm.train.sample.grading import grade
    from jaxrl_llm.train.sample.prompts import task_from_config

    out = path / "groups.jsonl"
    if out.exists() and len(out.read_text().splitlines()) == batches:
        return path
    path.mkdir(parents=True, exist_ok=True)
    task, groups = task_from_config(cfg), cfg.rollout.samples_per_prompt
    lines = []
    with contextlib.ExitStack() as stack:
        engine = make_engine(engine_spec(cfg), policy, policy.params, stack=stack)
        pool = stack.enter_context(GraderPool(num_workers=1, timeout_s=cfg.task.reward_timeout_s))
        for batch in range(batches):
            seed = cfg.seed * 1000 + batch
            examples = task.examples("train", cfg.rollout.prompts_per_step, seed=seed)
            rollouts = engine.generate(encode_prompts(policy, examples), n=groups,
                                       params=sampling_params(cfg.rollout, seed))
            rewards = grade(pool, task, decode_completions(policy, rollouts), examples, groups).rewards
            lengths = np.array([len(r.completion_token_ids) for r in rollouts.records]).reshape(-1, groups)
            lines.append(json.dumps({"step": batch + 1, "rewards": rewards.tolist(), "lengths": lengths.tolist()}))
            print(f"[experiment] {path.name}: batch {batch + 1}/{batches}, reward {float(rewards.mean()):.3f}",
                  flush=True)
    out.write_text("\n".join(lines) + "\n")
    return path


def main(argv: Sequence[str] | None = None) -> int:
    import json
    import os

    from jaxrl_llm.reports import difficulty
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.runs import chosen_seeds, experiment_parser, output_dir, variant_config, write_summary
    from jaxrl_llm.train.run.metrics import read_groups

    start, load_start = time.perf_counter(), os.getloadavg()
    parser = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, QUICK_SEEDS), results=True)
    parser.add_argument("--runs", nargs="*", default=None, help="run directories with groups.jsonl to measure")
    args = parser.parse_args(argv)
    out = output_dir(args, NAME)
    if args.runs:
        runs = {i: Path(r) for i, r in enumerate(args.runs)}
    else:
        from jaxrl_llm.train.policy import load_policy

        configs = {s: variant_config(get_config("", seed=s), out, f"base_s{s}", (), args.overrides, quick_on=False)
                   for s in chosen_seeds(args)}
        policy = load_policy(next(iter(configs.values())).model.source)
        batches = QUICK_BATCHES if args.quick else BATCHES
        runs = {s: sample_groups(cfg, policy, batches, cfg.run_path) for s, cfg in configs.items()}
    records = {s: read_groups(run) for s, run in runs.items()}
    sizes = {len(r["rewards"][0]) for recs in records.values() for r in recs}
    if len(sizes) != 1:
        raise ValueError(f"the runs {[str(r) for r in runs.values()]} have group sizes {sorted(sizes)}; "
                         f"valid: one group size")
    group_size = sizes.pop()
    per_seed = {s: seed_numbers(difficulty.measure(recs), group_size) for s, recs in records.items()}
    pooled = difficulty.measure([r for recs in records.values() for r in recs])
    difficulty.plot(pooled, out / "difficulty_bias.png",
                    title=f"Difficulty bias on {len(pooled['success'])} real groups from {len(runs)} run(s)")
    notes = [f"runs measured: {', '.join(str(r) for r in runs.values())}",
             "analytic: E|A| = 2p(1-p) without std; 2p(1-p)/std with std, std = sqrt(G/(G-1) p(1-p)) (ddof=1). "
             "grad share: mean share of a step's total |dL/dlog pi| held by one group at that p, from the real loss "
             "(both with seq-mean-token-mean aggregation).",
             f"per seed: {json.dumps({str(s): v for s, v in per_seed.items()})}"]
    write_summary(out, pooled["rows"], list(pooled["rows"][0]),
                  title=f"Difficulty bias ({'quick' if args.quick else 'full'}), all seeds' groups pooled",
                  notes=notes, config={"name": NAME, "quick": args.quick, "runs": [str(r) for r in runs.values()]})
    if args.results and not args.runs:
        wall = time.perf_counter() - start
        command = " ".join(["python experiments/difficulty_bias.py", *(sys.argv[1:] if argv is None else argv)])
        result = build_result(per_seed, command=command, setting=("--quick: " if args.quick else "") + "one GRPO run per seed, "
                              + ("6 steps x 4 prompts" if args.quick else "30 steps x 8 prompts")
                              + " x 8 samples, 32 tokens, SmolLM2-135M, 1-digit addition",
                              wall_s=wall, notes=[f"load average at the start: {list(round(x, 2) for x in load_start)}"])
        print(f"[experiment] wrote {write_result(result, args.results)}: {result.verdict}")
    print(f"wrote {out}/difficulty_bias.png, {out}/summary.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
