"""experiments/distill_addition.py's two stages are the settings the issue names: the teacher
is the demo on the JAX engine, the student the base model under opd with no task reward and
otherwise the teacher's settings (the run itself: experiments/README.md section 9)."""
from jaxrl_llm.reports.results import experiment_module

DEMO_CHANGES = {"rollout.engine": "jax", "task.eval_every": 8, "name": "distill_addition_teacher"}
STUDENT_CHANGES = {"recipe.name": "opd", "distill.reward_weight": 0.0, "name": "distill_addition_student"}


def flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        out.update(flat(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def changed(a, b) -> dict:
    fa, fb = flat(a.to_dict()), flat(b.to_dict())
    return {k: fb[k] for k in fb if k != "run_dir" and fa.get(k) != fb[k]}


def test_teacher_is_the_demo_on_jax_and_student_changes_only_the_objective(tmp_path):
    module = experiment_module("distill_addition")
    demo = experiment_module("demo").get_config()
    teacher, student = module.get_config("teacher"), module.get_config("student", str(tmp_path))
    assert changed(demo, teacher) == DEMO_CHANGES  # 8 steps, lr 2e-5, 8 x 8 samples, 12 tokens, fp32 kept
    assert changed(teacher, student) == {**STUDENT_CHANGES, "distill.teacher": str(tmp_path)}
    assert student.run_dir != teacher.run_dir
