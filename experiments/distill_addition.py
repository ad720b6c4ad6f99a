"""On-policy distillation in the issue's own setting: SmolLM2-135M-Instruct, 1-digit addition.

Stage 1 trains the teacher: the demo's config (experiments/demo.py: Dr. GRPO, 8 prompts x 8
samples, 12 tokens, lr 2e-5, fp32) on the JAX engine for 8 steps, checkpointing its last step.
Stage 2 distils the base SmolLM2 from that run directory: recipe.name=opd,
distill.reward_weight=0 (the task reward is measured, never in the loss), the same sampling
settings and lr, 8 steps. Held-out pass@1 (the 29 held-out questions x 8 samples, the task's
evaluation, seed EVAL_SEED, JAX engine) is measured for the base (base/eval.jsonl), the
teacher and the student (their eval.jsonl at the last step); teacher_reverse_kl per step
comes from the student's metrics.jsonl. On-policy distillation: Agarwal et al. 2024 (GKD,
arXiv 2306.13649); Gu et al. 2024 (MiniLLM, arXiv 2306.08543).

Every seed trains its own teacher and its own student (seed s: <out>/s<s>/teacher, <out>/s<s>/student),
so the seeds are independent replicates of the whole two-stage recipe; the base model's evaluation
does not depend on the training seed and is measured once (<out>/base).

    python experiments/distill_addition.py --seeds 101,102,103 --results experiments/results/distill_addition.json
    jaxrl train --config experiments/distill_addition.py:teacher
    jaxrl train --config experiments/distill_addition.py:student   # needs the teacher's run
"""
from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Sequence

from jaxrl_llm.train.config import Config, replace_values

NAME = "distill_addition"
OUT = Path("runs/experiments") / NAME / "full"
TEACHER_DIR = OUT / "teacher"
STEPS = 8
SEEDS = (101, 102, 103)  # fresh: the n = 1 run of e9b7ced used seed 0, which never counts here
MIN_SEEDS = 3
CLAIM = ("a short on-policy distillation run raises the base student's held-out pass@1 towards a teacher that "
         "learned the task, and its reverse KL to the teacher falls (Agarwal et al. 2024, arXiv 2306.13649)")
# Fixed before the deciding run (issue 51), replacing the n = 1 rule of e9b7ced. Each seed trains its own
# teacher and student; per seed: gap margin m = (student - base) - 0.5 x (teacher - base) (the student
# closed at least half of its own teacher's gap when m >= 0) and KL margin k = last step's
# teacher_reverse_kl - 0.5 x the first step's (the reverse KL at least halved when k < 0).
VERDICT_RULE = (
    f"95% Student-t intervals over >= {MIN_SEEDS} seeds, each seed its own teacher and student. Per seed: "
    "m = (student pass@1 - base pass@1) - 0.5 x (teacher pass@1 - base pass@1) and k = last step's "
    "teacher_reverse_kl - 0.5 x first step's. Not measured (inconclusive) unless the teacher's gain "
    "teacher - base has an interval above 0. reproduced if m's interval lies above 0 AND k's below 0; "
    "not reproduced if m's interval lies below 0 OR k's above 0; inconclusive otherwise or with fewer than "
    f"{MIN_SEEDS} seeds")
MARGIN_KEY, KL_KEY, TEACHER_GAIN_KEY = ("student gain - 0.5 teacher gain", "last - 0.5 first teacher_reverse_kl",
                                        "teacher pass@1 - base pass@1")


def _demo() -> Config:
    spec = importlib.util.spec_from_file_location("_demo_experiment", Path(__file__).with_name("demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config(stage: str = "student", teacher: str = str(TEACHER_DIR), seed: int | None = None) -> Config:
    """"teacher": the demo on the JAX engine, evaluated at its last step; "student": the base
    model distilled from the `teacher` run directory (opd, no task reward), the same settings.
    With `seed` the run is seeded so and lives in <OUT>/s<seed>/<stage> (the demo's seed 0 and
    <OUT>/<stage> without)."""
    folder = OUT if seed is None else OUT / f"s{seed}"
    cfg = replace_values(_demo(), {"rollout.engine": "jax", "task.eval_every": STEPS, "total_steps": STEPS,
                                   "name": f"{NAME}_teacher", "run_dir": str(folder / "teacher")})
    if seed is not None:
        cfg = replace_values(cfg, {"seed": seed})
    if stage == "teacher":
        return cfg
    if stage != "student":
        raise ValueError(f"stage {stage!r}; valid: 'teacher' or 'student'")
    return replace_values(cfg, {"recipe.name": "opd", "distill.teacher": teacher, "distill.reward_weight": 0.0,
                                "name": f"{NAME}_student", "run_dir": str(folder / "student")})


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored intervals (reports.results.number)."""
    from jaxrl_llm.reports.results import number, side

    margin, kl, teacher = (number(numbers, k) for k in (MARGIN_KEY, KL_KEY, TEACHER_GAIN_KEY))
    if min(margin.n, kl.n) < MIN_SEEDS:
        return "inconclusive"
    if side(margin) == "below 0" or side(kl) == "above 0":
        return "not reproduced"
    if side(teacher) != "above 0":  # the teacher learned nothing to pass on: the claim was not measured
        return "inconclusive"
    return "reproduced" if side(margin) == "above 0" and side(kl) == "below 0" else "inconclusive"


def seed_numbers(base: float, teacher: float, student: float, kl: Sequence[float]) -> dict[str, float]:
    """One seed's numbers: the three pass@1, the reverse KL at the first and last student step and
    the two margins VERDICT_RULE reads."""
    return {"base pass@1": base, "teacher pass@1": teacher, "student pass@1": student,
            "student pass@1 - base pass@1": student - base, TEACHER_GAIN_KEY: teacher - base,
            "teacher_reverse_kl first step": kl[0], "teacher_reverse_kl last step": kl[-1],
            MARGIN_KEY: (student - base) - 0.5 * (teacher - base), KL_KEY: kl[-1] - 0.5 * kl[0]}


def numbers_over_seeds(per_seed: dict[int, dict[str, float]]) -> tuple[dict, dict]:
    """({statistic: interval over seeds}, {statistic: {seed: value}}) from {seed: seed_numbers(...)}."""
    from jaxrl_llm.reports.results import interval_of, keyed

    keys = list(next(iter(per_seed.values())))
    by_key = {k: {s: values[k] for s, values in per_seed.items()} for k in keys}
    return {k: interval_of(v).to_dict() for k, v in by_key.items()}, {k: keyed(v) for k, v in by_key.items()}


def final_pass1(run: Path) -> float:
    from jaxrl_llm.train.run.metrics import read_metrics

    return float(read_metrics(run / "eval.jsonl")[-1]["pass@1"])


def base_pass1(cfg: Config, folder: Path = OUT / "base") -> float:
    """Held-out pass@1 of the untrained model, same evaluation as the runs' (its fixed evaluation
    seed, independent of the training seed); kept in `folder`."""
    from jaxrl_llm.train.run.evaluation import evaluate_params
    from jaxrl_llm.train.policy import load_policy

    cfg = replace_values(cfg, {"run_dir": str(folder)})
    if not (cfg.run_path / "eval.jsonl").exists():
        cfg.run_path.mkdir(parents=True, exist_ok=True)
        policy = load_policy(cfg.model.source)
        evaluate_params(cfg, policy, policy.params, step=0)
    return final_pass1(cfg.run_path)


def stage_seconds(run: Path) -> float:
    """A finished run's training wall time from its metrics.jsonl clock (model load not counted)."""
    from jaxrl_llm.train.run.metrics import read_metrics

    rows = read_metrics(run / "metrics.jsonl")
    return float(rows[-1]["time"] - rows[0]["time"] + rows[0]["time_step_s"])


def build_result(per_seed: dict[int, dict[str, float]], kls: dict[int, Sequence[float]], *, wall_s: float,
                 wall_note: str = "", results: str = "experiments/results/distill_addition.json"):
    """The stored result (reports/results.py) of {seed: seed_numbers(...)}, verdict by VERDICT_RULE."""
    from jaxrl_llm.reports.results import ExperimentResult

    numbers, stored = numbers_over_seeds(per_seed)
    seeds = tuple(per_seed)
    curves = json.dumps({str(s): [round(float(x), 4) for x in kl] for s, kl in kls.items()})
    return ExperimentResult(
        name=NAME, title="on-policy distillation, SmolLM2-135M, 1-digit addition", claim=CLAIM,
        setting="per seed: teacher = demo (Dr. GRPO) 8 steps, JAX engine; student = base SmolLM2, opd, "
                "reward_weight 0, 8 steps x 8 prompts x 8 samples, 12 tokens, lr 2e-5, fp32",
        command=f"python experiments/distill_addition.py --seeds {','.join(map(str, seeds))} --results {results}",
        seeds=seeds, statistic="held-out pass@1 (29 questions x 8 samples) of base / teacher / student after; the "
        "student's teacher_reverse_kl at its first and last step; the rule's two per-seed margins",
        interval_method="mean and 95% Student-t over seeds", verdict_rule=VERDICT_RULE,
        verdict=rule_verdict(numbers), headline="student pass@1 - base pass@1", numbers=numbers,
        per_seed=stored, wall_s=wall_s, wall_note=wall_note,
        notes=(f"teacher_reverse_kl per step, per seed: {curves}",))


def one_seed(seed: int) -> tuple[dict[str, float], list[float], float]:
    """Trains (or keeps) seed `seed`'s teacher and student; returns its numbers, the student's
    reverse KL per step and the seconds of training done before this invocation (kept runs)."""
    from jaxrl_llm.reports.runs import train_or_resume
    from jaxrl_llm.train.run.metrics import read_metrics

    earlier = 0.0
    teacher_cfg = get_config("teacher", seed=seed)
    if (teacher_cfg.run_path / "metrics.jsonl").exists():
        earlier += stage_seconds(teacher_cfg.run_path)
    teacher_run = train_or_resume(teacher_cfg)
    student_cfg = get_config("student", str(teacher_run), seed=seed)
    if (student_cfg.run_path / "metrics.jsonl").exists():
        earlier += stage_seconds(student_cfg.run_path)
    student_run = train_or_resume(student_cfg)
    kl = [float(r["teacher_reverse_kl"]) for r in read_metrics(student_run / "metrics.jsonl")]
    numbers = seed_numbers(base_pass1(student_cfg), final_pass1(teacher_run), final_pass1(student_run), kl)
    return numbers, kl, earlier


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.results import write_result
    from jaxrl_llm.reports.runs import chosen_seeds, experiment_parser

    start = time.perf_counter()
    args = experiment_parser(__doc__, name=NAME, seeds=(SEEDS, SEEDS), results=True).parse_args(argv)
    if args.quick or args.out or args.overrides:
        raise SystemExit("distill_addition: one size only (no --quick, --out or overrides); see the docstring")
    seeds = chosen_seeds(args)
    per_seed, kls, earlier = {}, {}, 0.0
    for seed in seeds:
        per_seed[seed], kls[seed], kept = one_seed(seed)
        earlier += kept
        print(f"[experiment] seed {seed}: {json.dumps(per_seed[seed])}", flush=True)
    numbers, stored = numbers_over_seeds(per_seed)
    wall = time.perf_counter() - start + earlier
    note = f"incl. {earlier:.0f} s of training done before this invocation" if earlier else ""
    summary = {"seeds": list(seeds), "numbers": numbers, "per_seed": stored,
               "teacher_reverse_kl per step": {str(s): kl for s, kl in kls.items()}, "wall_s": wall}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if args.results:
        result = build_result(per_seed, kls, wall_s=wall, wall_note=note, results=args.results)
        print(f"[experiment] wrote {write_result(result, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
