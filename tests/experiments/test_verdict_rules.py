"""The verdict rules each experiment file fixes before its run (issue 36), on hand-made
numbers: the stored verdict of experiments/results/*.json is these functions' output."""
import math

import pytest

from jaxrl_llm.reports.results import experiment_module

NAN = math.nan


def iv(mean, low=NAN, high=NAN, n=1):
    return {"mean": mean, "low": low, "high": high, "n": n}


def test_length_bias_pairs_by_seed_and_reads_the_paired_interval():
    module = experiment_module("length_bias")
    row = lambda inc: {"d length_incorrect": inc, "d length_correct": 0.0, "reward last": 0.9}  # noqa: E731
    # GRPO 1, 2, 3 and Dr. GRPO 0, 0.5, 1 per seed: differences 1, 1.5, 2 -> mean 1.5, sd 0.5
    result = module.deciding_result({"grpo": [row(1), row(2), row(3)], "dr_grpo": [row(0), row(0.5), row(1)]},
                                    (10, 11, 12), setting="s", command="c", wall_s=1.0)
    diff = result.numbers["grpo - dr_grpo d length_incorrect"]
    half = 4.302652729911275 * 0.5 / math.sqrt(3)  # t_{0.975, 2} sd / sqrt(n)
    assert (diff["mean"], diff["low"], diff["high"]) == pytest.approx((1.5, 1.5 - half, 1.5 + half))
    assert result.per_seed["grpo - dr_grpo d length_incorrect"] == {"10": 1.0, "11": 1.5, "12": 2.0}
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    # unpaired the same numbers would not resolve: GRPO's own spread (sd 1) is twice the paired one
    assert module.rule_verdict({"grpo - dr_grpo d length_incorrect": iv(-1.0, -2.0, -0.5, 3)}) == "not reproduced"
    assert module.rule_verdict({"grpo - dr_grpo d length_incorrect": iv(1.0, -2.0, 3.0, 3)}) == "inconclusive"


def test_diversity_excludes_diverged_pairs_and_needs_eight_kept_seeds():
    module = experiment_module("diversity")
    row = lambda p1, p16: {"pass@1": p1, "pass@16": p16, "distinct correct / prompt": 1.0}  # noqa: E731
    seeds = list(range(100, 110))
    per_seed = {}
    for s in seeds:
        per_seed[("grpo", s)] = row(0.3, 0.0 if s in (101, 102) else 0.5)  # two GRPO runs diverged
        per_seed[("darling", s)] = row(0.3, 0.9 if s % 2 else 0.8)
    result = module.deciding_result(per_seed, seeds, command="c", wall_s=1.0)
    assert result.excluded == {"101": "grpo diverged", "102": "grpo diverged"}
    assert result.seeds == (100, 103, 104, 105, 106, 107, 108, 109)
    assert result.numbers["darling - grpo pass@16"]["n"] == 8
    assert result.numbers["darling - grpo pass@16"]["mean"] == pytest.approx(0.85 - 0.5)
    assert result.numbers["grpo diverged (of 10)"]["mean"] == 2
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    per_seed[("darling", 103)] = row(0.3, 0.0)  # a third pair out: 7 kept < 8
    assert module.deciding_result(per_seed, seeds, command="c", wall_s=1.0).verdict == "inconclusive"


def test_length_mechanism_reads_the_three_splits_together():
    rule = experiment_module("length_mechanism").rule_verdict
    grpo, dr = iv(-0.6, -0.8, -0.5, 10), iv(0.0, -0.001, 0.001, 10)
    numbers = {"grpo d split": grpo, "dr_grpo d split": dr}
    assert rule({**numbers, "dapo d split": iv(0.007, -0.009, 0.023, 10)}) == "inconclusive"  # the recorded run
    assert rule({**numbers, "dapo d split": iv(-0.02, -0.03, -0.01, 10)}) == "reproduced"
    assert rule({**numbers, "dapo d split": iv(-0.9, -1.0, -0.8, 10)}) == "inconclusive"  # not between
    assert rule({**numbers, "dr_grpo d split": iv(0.1, 0.05, 0.15, 10),
                 "dapo d split": iv(-0.02, -0.03, -0.01, 10)}) == "not reproduced"


def test_precision_rule_asks_for_an_order_of_magnitude_on_both_engines():
    rule = experiment_module("precision_mismatch").rule_verdict
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(90, 65, 115, 3)}) == "reproduced"
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(6, 3, 9, 3)}) == "not reproduced"
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(20, 5, 40, 3)}) == "inconclusive"
    assert rule({"vllm k3 bf16/fp16": iv(66), "jax k3 bf16/fp16": iv(90)}) == "inconclusive"  # one seed


def test_distill_addition_needs_half_the_gap_and_half_the_kl():
    rule = experiment_module("distill_addition").rule_verdict
    # base 0.2, teacher 0.9: half the gap is 0.35, so the student must reach 0.55; KL must fall below half
    numbers = lambda student, kl_last: {"base pass@1": iv(0.2), "teacher pass@1": iv(0.9),  # noqa: E731
                                        "student pass@1": iv(student), "teacher_reverse_kl first step": iv(1.0),
                                        "teacher_reverse_kl last step": iv(kl_last)}
    assert rule(numbers(0.56, 0.4)) == "reproduced"
    assert rule(numbers(0.54, 0.4)) == "not reproduced"  # student short of half the gap
    assert rule(numbers(0.9, 0.6)) == "not reproduced"  # KL fell, but not below half
