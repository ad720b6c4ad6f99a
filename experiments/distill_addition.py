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

    python experiments/distill_addition.py --results experiments/results/distill_addition.json
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
CLAIM = ("a short on-policy distillation run raises the base student's held-out pass@1 towards a teacher that "
         "learned the task, and its reverse KL to the teacher falls (Agarwal et al. 2024, arXiv 2306.13649)")
# Fixed before the run (one seed fits the time: n = 1, no interval).
VERDICT_RULE = ("n = 1 seed. reproduced if student pass@1 - base pass@1 >= 0.5 x (teacher pass@1 - base pass@1) "
                "AND the last step's teacher_reverse_kl < 0.5 x the first step's; not reproduced otherwise")


def _demo() -> Config:
    spec = importlib.util.spec_from_file_location("_demo_experiment", Path(__file__).with_name("demo.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def get_config(stage: str = "student", teacher: str = str(TEACHER_DIR)) -> Config:
    """"teacher": the demo on the JAX engine, evaluated at its last step; "student": the base
    model distilled from the `teacher` run directory (opd, no task reward), the same settings."""
    cfg = replace_values(_demo(), {"rollout.engine": "jax", "task.eval_every": STEPS, "total_steps": STEPS,
                                   "name": f"{NAME}_teacher", "run_dir": str(TEACHER_DIR)})
    if stage == "teacher":
        return cfg
    if stage != "student":
        raise ValueError(f"stage {stage!r}; valid: 'teacher' or 'student'")
    return replace_values(cfg, {"recipe.name": "opd", "distill.teacher": teacher, "distill.reward_weight": 0.0,
                                "name": f"{NAME}_student", "run_dir": str(OUT / "student")})


def verdict(base: float, teacher: float, student: float, kl_first: float, kl_last: float) -> str:
    """VERDICT_RULE."""
    moved = student - base >= 0.5 * (teacher - base)
    return "reproduced" if moved and kl_last < 0.5 * kl_first else "not reproduced"


def rule_verdict(numbers: dict) -> str:
    """VERDICT_RULE on the stored numbers."""
    get = lambda k: float(numbers[k]["mean"])
    return verdict(get("base pass@1"), get("teacher pass@1"), get("student pass@1"),
                   get("teacher_reverse_kl first step"), get("teacher_reverse_kl last step"))


def final_pass1(run: Path) -> float:
    from jaxrl_llm.train.run.metrics import read_metrics

    return float(read_metrics(run / "eval.jsonl")[-1]["pass@1"])


def base_pass1(cfg: Config) -> float:
    """Held-out pass@1 of the untrained model, same evaluation as the runs'; kept in <out>/base."""
    from jaxrl_llm.train.run.evaluation import evaluate_params
    from jaxrl_llm.train.policy import load_policy

    cfg = replace_values(cfg, {"run_dir": str(Path(cfg.run_dir).parent / "base")})
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


def one(value: float) -> dict[str, float]:
    return {"mean": float(value), "low": float("nan"), "high": float("nan"), "n": 1}


def main(argv: Sequence[str] | None = None) -> int:
    from jaxrl_llm.reports.results import ExperimentResult, write_result
    from jaxrl_llm.reports.runs import experiment_parser, train_or_resume
    from jaxrl_llm.train.run.metrics import read_metrics

    start = time.perf_counter()
    args = experiment_parser(__doc__, name=NAME, results=True).parse_args(argv)
    if args.quick or args.out or args.overrides:
        raise SystemExit("distill_addition: one size only (no --quick, --out or overrides); see the docstring")
    teacher_kept = (TEACHER_DIR / "metrics.jsonl").exists()
    teacher_run = train_or_resume(get_config("teacher"))
    student_cfg = get_config("student", str(teacher_run))
    student_run = train_or_resume(student_cfg)
    kl = [float(r["teacher_reverse_kl"]) for r in read_metrics(student_run / "metrics.jsonl")]
    numbers = {"base pass@1": one(base_pass1(student_cfg)), "teacher pass@1": one(final_pass1(teacher_run)),
               "student pass@1": one(final_pass1(student_run)), "teacher_reverse_kl first step": one(kl[0]),
               "teacher_reverse_kl last step": one(kl[-1])}
    wall = time.perf_counter() - start
    note = ""
    if teacher_kept:  # an earlier invocation (or `jaxrl train --config ...:teacher`) trained it
        wall += stage_seconds(teacher_run)
        note = f"incl. the teacher stage trained before this invocation ({stage_seconds(teacher_run):.0f} s)"
    summary = {k: v["mean"] for k, v in numbers.items()} | {"teacher_reverse_kl per step": kl, "wall_s": wall}
    (OUT / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    if args.results:
        result = ExperimentResult(
            name=NAME, title="on-policy distillation, SmolLM2-135M, 1-digit addition", claim=CLAIM,
            setting="teacher: demo (Dr. GRPO) 8 steps, JAX engine; student: base SmolLM2, opd, reward_weight 0, "
                    "8 steps x 8 prompts x 8 samples, 12 tokens, lr 2e-5, fp32",
            command="python experiments/distill_addition.py --results experiments/results/distill_addition.json",
            seeds=(0,), statistic="held-out pass@1 (29 questions x 8 samples) of base / teacher / student after; "
            "student's teacher_reverse_kl at its first and last step", interval_method="none (1 seed)",
            verdict_rule=VERDICT_RULE, verdict=rule_verdict(numbers), headline="student pass@1", numbers=numbers,
            per_seed={k: {"0": v["mean"]} for k, v in numbers.items()}, wall_s=wall,
            wall_note=note)
        print(f"[experiment] wrote {write_result(result, args.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
