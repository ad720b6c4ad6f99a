"""experiments/distill_addition.py's two stages are the settings the issue names: the teacher
is the demo on the JAX engine, the student the base model under opd with no task reward and
otherwise the teacher's settings (the run itself: experiments/README.md section 9)."""
import pytest

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


def test_a_seed_gets_its_own_teacher_and_student_folder_and_only_its_seed_changes(tmp_path):
    module = experiment_module("distill_addition")
    teacher = module.get_config("teacher", seed=101)
    assert changed(module.get_config("teacher"), teacher) == {"seed": 101}
    assert teacher.run_dir.endswith("full/s101/teacher")
    assert module.get_config("student", str(tmp_path), seed=101).run_dir.endswith("full/s101/student")


T_975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom (tables)


def three_seeds(module, students=(0.9, 0.8, 0.8), teachers=(0.9, 0.8, 0.7), kl_last=(0.1, 0.05, 0.2)):
    """Base 0.1 for every seed; first-step reverse KL 1.0, 0.8, 0.9."""
    return {seed: module.seed_numbers(0.1, t, s, [first, 0.5, last])
            for seed, s, t, first, last in zip((101, 102, 103), students, teachers, (1.0, 0.8, 0.9), kl_last)}


def test_distill_rule_reads_the_gap_and_kl_margins_over_seeds():
    module = experiment_module("distill_addition")
    result = module.build_result(three_seeds(module), {101: [1.0, 0.1]}, wall_s=1.0)
    # margins (student - base) - 0.5 (teacher - base): 0.8 - 0.4, 0.7 - 0.35, 0.7 - 0.3 = 0.4, 0.35, 0.4
    m = result.numbers[module.MARGIN_KEY]
    sd = ((2 * (0.4 - 0.38333333) ** 2 + (0.35 - 0.38333333) ** 2) / 2) ** 0.5
    half = T_975_2 * sd / 3 ** 0.5
    assert (m["mean"], m["low"], m["high"], m["n"]) == pytest.approx((0.38333333, 0.38333333 - half,
                                                                      0.38333333 + half, 3))
    # kl margins 0.1 - 0.5, 0.05 - 0.4, 0.2 - 0.45 = -0.4, -0.35, -0.25
    assert result.per_seed[module.KL_KEY] == pytest.approx({"101": -0.4, "102": -0.35, "103": -0.25})
    assert result.numbers["student pass@1 - base pass@1"]["mean"] == pytest.approx((0.8 + 0.7 + 0.7) / 3)
    assert result.numbers["teacher_reverse_kl last step"]["mean"] == pytest.approx((0.1 + 0.05 + 0.2) / 3)
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)


def test_distill_rule_broken_on_purpose():
    module = experiment_module("distill_addition")
    verdict = lambda per_seed: module.numbers_over_seeds(per_seed)[0]  # noqa: E731
    rule = module.rule_verdict
    # a student that closed only a quarter of its teacher's gap: margin interval below 0
    assert rule(verdict(three_seeds(module, students=(0.3, 0.28, 0.25)))) == "not reproduced"
    # a reverse KL that did not halve (last 0.9, 0.7, 0.8 against first 1.0, 0.8, 0.9): KL margin above 0
    assert rule(verdict(three_seeds(module, kl_last=(0.9, 0.7, 0.8)))) == "not reproduced"
    # a teacher that learned nothing (teacher == base +- noise): not measured, inconclusive
    flat_teacher = three_seeds(module, students=(0.3, 0.32, 0.28), teachers=(0.15, 0.05, 0.12))  # margins > 0
    assert rule(verdict(flat_teacher)) == "inconclusive"
    # two seeds only: below the rule's minimum of three
    assert rule(verdict({k: v for k, v in three_seeds(module).items() if k != 103})) == "inconclusive"
    # a margin whose interval covers 0: inconclusive
    assert rule(verdict(three_seeds(module, students=(0.9, 0.2, 0.5)))) == "inconclusive"
