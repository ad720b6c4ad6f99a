"""The verdict rules each experiment file fixes before its run (issue 36), on hand-made
numbers: the stored verdict of experiments/results/*.json is these functions' output."""
import json
import math

import numpy as np

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
    assert result.verdict == "reproduced" and result.verdict_rule == module.EARLIER_RULE  # issue 36's rule
    # the stored result's rule (POWERED_RULE) asks for 18 seeds: 3 cannot decide
    assert module.VERDICT_RULE == module.POWERED_RULE and module.rule_verdict(result.numbers) == "inconclusive"
    # unpaired the same numbers would not resolve: GRPO's own spread (sd 1) is twice the paired one
    earlier = lambda *a: module.verdict(module.stats.Interval(*a))  # noqa: E731
    assert earlier(-1.0, -2.0, -0.5, 3) == "not reproduced" and earlier(1.0, -2.0, 3.0, 3) == "inconclusive"


def test_diversity_excludes_diverged_pairs_reports_all_seeds_and_refuses_frequent_divergence():
    """VERDICT_RULE of issue 51 on 20 hand-made seeds: DARLING pass@16 0.8 / 0.9 (even / odd seed),
    GRPO 0.5; pass@1 0.3 in both."""
    module = experiment_module("diversity")
    assert module.DECIDING_SEEDS == tuple(range(3000, 3020))
    assert not set(module.DECIDING_SEEDS) & {*module.TUNING_SEEDS, *range(100, 116), *range(1000, 1016)}
    row = lambda p1, p16: {"pass@1": p1, "pass@16": p16, "distinct correct / prompt": 1.0}  # noqa: E731
    seeds = list(module.DECIDING_SEEDS)
    per_seed = {}
    for s in seeds:
        per_seed[("grpo", s)] = row(0.3, 0.0 if s in (3001, 3002) else 0.5)  # two GRPO runs diverged: 10%
        per_seed[("darling", s)] = row(0.3, 0.9 if s % 2 else 0.8)
    result = module.deciding_result(per_seed, seeds, command="c", wall_s=1.0)
    assert result.excluded == {"3001": "grpo diverged", "3002": "grpo diverged"}
    assert result.seeds == tuple(s for s in seeds if s not in (3001, 3002))
    kept = result.numbers["darling - grpo pass@16"]
    assert kept["n"] == 18 and kept["mean"] == pytest.approx(0.85 - 0.5)
    # all 20 seeds, no exclusion: 18 kept differences average 0.35; 3001 gives 0.9 - 0 and 3002 0.8 - 0
    everyone = result.numbers["darling - grpo pass@16 (all seeds)"]
    assert everyone["n"] == 20 and everyone["mean"] == pytest.approx((18 * 0.35 + 0.9 + 0.8) / 20)
    assert result.numbers["grpo diverged (of 20)"]["mean"] == 2
    assert result.numbers["darling diverged (of 20)"]["mean"] == 0
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    per_seed[("grpo", 3004)] = row(0.3, 0.0)  # a third GRPO divergence: 15% > 10%
    assert module.deciding_result(per_seed, seeds, command="c", wall_s=1.0).verdict == "inconclusive"
    per_seed[("grpo", 3004)] = row(0.3, 0.5)
    per_seed[("darling", 3004)] = row(0.3, 0.0)  # one DARLING divergence (5%) leaves 17 kept >= 16
    assert module.deciding_result(per_seed, seeds, command="c", wall_s=1.0).verdict == "reproduced"
    short = module.deciding_result(per_seed, seeds[3:18], command="c", wall_s=1.0)  # 3003-3017: 14 kept < 16
    assert short.numbers["darling - grpo pass@16"]["n"] == 14 and short.verdict == "inconclusive"
    per_seed = {key: row(0.3, 0.9 if key[0] == "darling" else 0.5) for key in per_seed}
    for s in seeds[:10]:
        per_seed[("darling", s)] = row(0.1, 0.9)  # pass@1 -0.2 in half the seeds: mean -0.1, interval below 0
    assert module.deciding_result(per_seed, seeds, command="c", wall_s=1.0).verdict == "not reproduced"


M_SPLIT, M_LENGTH = 0.0247, 1.16  # the full size's margins (pinned in the margin test below)


def mechanism_numbers(**changes):
    zero = iv(0.0, -0.001, 0.001, 10)  # a no-effect arm's own d split, well inside +-0.0247
    base = {"grpo - dr_grpo d split": iv(-0.6, -0.8, -0.5, 10), "dapo - dr_grpo d split": iv(-0.02, -0.03, -0.01, 10),
            "grpo_shared d split": zero, "grpo_shared d length split": iv(0.1, -0.4, 0.6, 10),
            "dr_grpo d split": zero, "dr_grpo d length split": iv(-0.2, -0.5, 0.1, 10),
            "equivalence margin d split": iv(M_SPLIT), "equivalence margin d length split": iv(M_LENGTH)}
    return {**base, **changes}


def test_length_mechanism_pairs_against_dr_grpo_and_judges_no_effect_arms_by_margins():
    module = experiment_module("length_mechanism")
    rule, readings = module.rule_verdict, module.rule_readings
    base = mechanism_numbers()
    assert readings(base) == {"grpo": "reproduced", "token-mean": "reproduced", "shared-stop": "reproduced",
                              "constant normaliser": "reproduced"}
    assert rule(base) == "reproduced"
    # the stored run of issue 36: the shared-stop length split -0.38 [-0.68, -0.07] excludes 0 but lies inside
    # +-1.16 tokens: no effect, where "the interval covers 0" called it a refutation
    issue36 = mechanism_numbers(**{"grpo_shared d length split": iv(-0.376, -0.684, -0.068, 10)})
    assert readings(issue36)["shared-stop"] == "reproduced"
    # token-mean covering 0: inconclusive, not "not reproduced"
    assert rule(mechanism_numbers(**{"dapo - dr_grpo d split": iv(0.007, -0.009, 0.023, 10)})) == "inconclusive"
    # token-mean as large as GRPO (its upper end below GRPO's mean -0.6): not in between
    assert readings(mechanism_numbers(**{"dapo - dr_grpo d split": iv(-0.9, -1.0, -0.8, 10)}))["token-mean"] == \
        "not reproduced"
    # below 0 but its mean under GRPO's, interval reaching above it: inconclusive
    assert readings(mechanism_numbers(**{"dapo - dr_grpo d split": iv(-0.7, -0.9, -0.1, 10)}))["token-mean"] == \
        "inconclusive"
    # a split in the shared-stop arm's sampled lengths wholly beyond the margin refutes the mechanism
    split = mechanism_numbers(**{"grpo_shared d length split": iv(2.0, 1.5, 3.0, 10)})
    assert readings(split)["shared-stop"] == "not reproduced" and rule(split) == "not reproduced"
    # an interval that crosses the margin: not measured precisely enough, inconclusive (not "no effect")
    wide = mechanism_numbers(**{"grpo_shared d length split": iv(0.0, -2.0, 2.0, 10)})
    assert readings(wide)["shared-stop"] == "inconclusive" and rule(wide) == "inconclusive"
    # Dr. GRPO drifting: its own d split wholly below -0.0247 refutes "no drift"
    drift = mechanism_numbers(**{"dr_grpo d split": iv(-0.05, -0.07, -0.03, 10)})
    assert readings(drift)["constant normaliser"] == "not reproduced" and rule(drift) == "not reproduced"
    # Dr. GRPO's length split crossing the margin: inconclusive
    assert readings(mechanism_numbers(**{"dr_grpo d length split": iv(-1.0, -2.0, 0.0, 10)}))[
        "constant normaliser"] == "inconclusive"
    # no shared-stop arm run, or no margins stored: the no-effect readings stay inconclusive
    assert rule({k: v for k, v in base.items() if "shared" not in k}) == "inconclusive"
    assert set(readings({k: v for k, v in base.items() if "margin" not in k}).values()) >= {"inconclusive"}
    # GRPO above 0: not reproduced; one seed: no interval, inconclusive
    assert rule(mechanism_numbers(**{"grpo - dr_grpo d split": iv(0.3, 0.1, 0.5, 10)})) == "not reproduced"
    one = {k: iv(v["mean"]) for k, v in base.items()}
    assert set(readings(one).values()) == {"inconclusive"}


def test_length_mechanism_margins_come_from_the_closed_form_force_and_a_monte_carlo_check():
    """R = token-mean's push / GRPO's, each D / E[w] (reports/length_drift.py), checked by simulation:
    32 responses of j ~ truncated geometric(q = 0.2) free tokens, K = 47, score s = 1 - q j (stopped) or
    -q K (truncated); GRPO's weight 1/L, token-mean's 1/(sum of the 32 lengths)."""
    module = experiment_module("length_mechanism")
    from jaxrl_llm.reports.length_mechanism import MechanismStudy

    margins = module.equivalence_margins(MechanismStudy())
    assert (margins.split, margins.length) == pytest.approx((M_SPLIT, M_LENGTH), abs=5e-4)
    assert margins.length == pytest.approx(47 * margins.split)
    rng = np.random.default_rng(0)
    q, k, n, draws = 0.2, 47, 32, 40_000
    j = np.minimum(rng.geometric(q, size=(draws, n)), k + 1)  # k + 1: did not stop within k
    truncated = j > k
    length = np.where(truncated, k, j).astype(float)
    score = np.where(truncated, -q * k, 1 - q * j)
    grpo = np.mean(score / length) / np.mean(1 / length)
    total = length.sum(axis=1, keepdims=True)
    token_mean = np.mean(score / total) / np.mean(1 / total)
    assert margins.push_ratio == pytest.approx(token_mean / grpo, rel=0.1)
    # a margin that moved with the measurement would differ between studies of other q0 or N: it does not
    # depend on anything but the settings
    import dataclasses
    assert module.equivalence_margins(dataclasses.replace(MechanismStudy(), seeds=3)) == margins


def test_length_mechanism_deciding_result_pairs_by_seed():
    module = experiment_module("length_mechanism")
    from jaxrl_llm.reports.length_mechanism import MechanismStudy

    def row(split, length_split=0.0):
        return {"d split": split, "d length split": length_split}

    # GRPO -0.5, -0.7, -0.6 against Dr. GRPO +0.001, -0.001, 0.0: paired -0.501, -0.699, -0.6
    per_seed = {"grpo": [row(-0.5), row(-0.7), row(-0.6)], "dr_grpo": [row(0.001), row(-0.001), row(0.0)],
                "dapo": [row(-0.021), row(-0.031), row(-0.03)],
                "grpo_shared": [row(0.0, 0.1), row(0.0, -0.1), row(0.0, 0.05)]}
    result = module.deciding_result(per_seed, (120, 121, 122), MechanismStudy(), command="c", wall_s=1.0)
    paired = result.numbers["grpo - dr_grpo d split"]
    sd = np.std([-0.501, -0.699, -0.6], ddof=1)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2} sd / sqrt(n)
    assert (paired["mean"], paired["low"], paired["high"]) == pytest.approx((-0.6, -0.6 - half, -0.6 + half))
    assert result.per_seed["dapo - dr_grpo d split"] == pytest.approx({"120": -0.022, "121": -0.03, "122": -0.03})
    assert result.numbers["equivalence margin d split"]["mean"] == pytest.approx(M_SPLIT, abs=5e-4)
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    assert result.tuning_seeds == (0, 100, *range(110, 120)) and result.headline == "dapo - dr_grpo d split"
    with pytest.raises(ValueError, match="tuning seeds"):  # seed 110 informed this rule: it may not count
        module.deciding_result(per_seed, (110, 121, 122), MechanismStudy(), command="c", wall_s=1.0)


def test_precision_rule_asks_for_an_order_of_magnitude_on_both_engines():
    rule = experiment_module("precision_mismatch").rule_verdict
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(90, 65, 115, 3)}) == "reproduced"
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(6, 3, 9, 3)}) == "not reproduced"
    assert rule({"vllm k3 bf16/fp16": iv(66, 52, 81, 3), "jax k3 bf16/fp16": iv(20, 5, 40, 3)}) == "inconclusive"
    assert rule({"vllm k3 bf16/fp16": iv(66), "jax k3 bf16/fp16": iv(90)}) == "inconclusive"  # one seed


def _precision_rows(k3_bf16, k1_bf16=2e-3):
    """mismatch.json rows of one seed: matched bf16 and fp16 pairs of both engines (fp16 k3 = 1e-5,
    k1 = 1e-4, max |dlogp| = 0.1, slope -1e-4; bf16 max |dlogp| 0.6, slope -2e-3), plus an
    unmatched row that must not count."""
    row = lambda engine, dtype, k1, k3, dmax, slope: {  # noqa: E731
        "sampler": f"{engine}:{dtype}", "learner": dtype, "matched": True, "k1": k1, "k3": k3,
        "max_abs_logprob_diff": dmax, "seq_log_ratio_length_slope": slope}
    rows = [row(e, "bf16", k1_bf16, k3_bf16, 0.6, -2e-3) for e in ("vllm", "jax")]
    rows += [row(e, "fp16", 1e-4, 1e-5, 0.1, -1e-4) for e in ("vllm", "jax")]
    return rows + [{**row("vllm", "bf16", 1.0, 1.0, 1.0, 1.0), "learner": "fp32", "matched": False}]


def test_precision_deciding_result_takes_ratios_per_seed_on_the_log_scale(tmp_path, capsys):
    module = experiment_module("precision_mismatch")
    # k3 ratios 500, 600, 700 (bf16 k3 5e-3 .. 7e-3 over fp16 1e-5): geometric mean (500*600*700)^(1/3) = 594.4
    dirs = []
    for seed, k3 in ((3, 7e-3), (1, 5e-3), (2, 6e-3)):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        study = {"model": "smollm2", "prompts": 32, "samples": 8, "max_tokens": 128, "temperature": 1.0,
                 "seed": seed, "engines": ["jax", "vllm"]}
        k1 = -1e-4 if seed == 2 else 2e-3  # one seed's bf16 k1 below 0: no log interval for k1
        (d / "mismatch.json").write_text(json.dumps({"study": study, "rows": _precision_rows(k3, k1), "wall_s": 60.0}))
        dirs.append(str(d))
    out = tmp_path / "result.json"
    assert module.main(["--collect", *dirs, "--results", str(out)]) == 0
    stored = json.loads(out.read_text())
    logs = [math.log(500), math.log(600), math.log(700)]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = 4.302653 * sd / math.sqrt(3)
    k3 = stored["numbers"]["vllm k3 bf16/fp16"]
    assert (k3["mean"], k3["low"], k3["high"], k3["n"]) == pytest.approx(
        (math.exp(mean), math.exp(mean - half), math.exp(mean + half), 3), rel=1e-6)
    assert k3["mean"] == pytest.approx(594.4, abs=0.1)
    assert stored["per_seed"]["jax k3 bf16/fp16"] == pytest.approx({"1": 500.0, "2": 600.0, "3": 700.0})
    assert stored["numbers"]["vllm max_abs_logprob_diff bf16/fp16"]["mean"] == pytest.approx(6.0)
    assert "vllm k1 bf16/fp16" not in stored["numbers"]
    assert stored["per_seed"]["vllm k1 bf16/fp16"]["2"] == pytest.approx(-1.0)
    assert stored["seeds"] == [1, 2, 3] and stored["wall_s"] == 180.0 and stored["verdict"] == "reproduced"
    assert stored["wall_note"] == "3 seeds in turn: 1 min 0 s + 1 min 0 s + 1 min 0 s"
    # each matched pair's own values, a plain mean over seeds; the unmatched fp32-learner row never counts
    assert stored["numbers"]["vllm:bf16 matched k3"]["mean"] == pytest.approx(6e-3)
    assert stored["per_seed"]["jax:fp16 matched k1"] == pytest.approx({"1": 1e-4, "2": 1e-4, "3": 1e-4})
    assert stored["numbers"]["vllm:bf16 matched seq_log_ratio_length_slope"]["mean"] == pytest.approx(-2e-3)
    assert "594" in capsys.readouterr().out
    # ratios 1, 100, 10000 (geometric mean 100): far too spread for n = 3 -> inconclusive
    spread = {s: _precision_rows(1e-5 * r) for s, r in ((1, 1.0), (2, 100.0), (3, 10000.0))}
    result = module.deciding_result(spread, setting="s", command="c", wall_s=None)
    assert result.numbers["vllm k3 bf16/fp16"]["mean"] == pytest.approx(100.0)
    assert result.verdict == "inconclusive"


def test_precision_collect_refuses_runs_that_differ_beyond_the_seed(tmp_path):
    module = experiment_module("precision_mismatch")
    dirs = []
    for seed, tokens in ((1, 128), (2, 64)):
        d = tmp_path / f"s{seed}"
        d.mkdir()
        study = {"model": "smollm2", "prompts": 32, "samples": 8, "max_tokens": tokens, "temperature": 1.0,
                 "seed": seed, "engines": ["jax"]}
        (d / "mismatch.json").write_text(json.dumps({"study": study, "rows": _precision_rows(5e-3)}))
        dirs.append(str(d))
    with pytest.raises(SystemExit, match="differ in more than the seed"):
        module.main(["--collect", *dirs])
    with pytest.raises(SystemExit, match="no mismatch.json there"):
        module.main(["--collect", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:  # a single run cannot write the multi-seed result
        module.main(["--results", str(tmp_path / "r.json")])
    assert exit_info.value.code == 2 and not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------- difficulty bias (issue 51)
T_975_2 = 4.302652729911275  # Student t, 0.975 quantile, 2 degrees of freedom (tables)


def difficulty_seed(edge, gap=1e-6):
    return {"max |measured - closed form| E|A|": gap, "gradient share with / without std, p in {1/8, 7/8}": edge,
            "gradient share with / without std, p = 1/2": 0.9, "groups at p in {1/8, 7/8}": 2.0, "groups": 8.0}


def test_difficulty_seed_numbers_from_hand_derived_groups():
    """One step, G = 8, a p = 1/8 and a p = 1/2 group (hand values: tests/experiments/test_experiments.py):
    shares without std 8*0.21875 / (8*0.21875 + 8*0.5) = 0.304348, with std 0.618718 / (0.618718 + 0.935414)
    = 0.398112: the edge group's ratio 1.308083; the p = 1/2 group's 0.601888 / 0.695652 = 0.865214."""
    from jaxrl_llm.reports import difficulty

    module = experiment_module("difficulty_bias")
    rewards = [[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    lengths = [[3, 5, 7, 9, 2, 4, 6, 8], [1, 2, 3, 4, 5, 6, 7, 8]]
    numbers = module.seed_numbers(difficulty.measure([{"step": 1, "rewards": rewards, "lengths": lengths}]), 8)
    assert numbers[module.EDGE_KEY] == pytest.approx(1.308083, rel=1e-4)
    assert numbers["gradient share with / without std, p = 1/2"] == pytest.approx(0.865214, rel=1e-4)
    assert numbers[module.IDENTITY_KEY] < 1e-4 and numbers["groups"] == 2 and numbers["groups at p in {1/8, 7/8}"] == 1
    # a step without an edge group: that seed is not measured (nan), not "no effect"
    mid_only = module.seed_numbers(difficulty.measure([{"step": 1, "rewards": [rewards[1], rewards[1]],
                                                        "lengths": lengths}]), 8)
    assert math.isnan(mid_only[module.EDGE_KEY])


def test_difficulty_rule_reads_the_edge_ratio_interval_over_seeds():
    module = experiment_module("difficulty_bias")
    build = lambda edges, gap=1e-6: module.build_result(  # noqa: E731
        {201 + i: difficulty_seed(e, gap) for i, e in enumerate(edges)}, command="c", setting="s", wall_s=1.0)
    result = build((1.3, 1.2, 1.25))  # mean 1.25, sd 0.05
    edge = result.numbers[module.EDGE_KEY]
    half = T_975_2 * 0.05 / math.sqrt(3)
    assert (edge["mean"], edge["low"], edge["high"], edge["n"]) == pytest.approx((1.25, 1.25 - half, 1.25 + half, 3))
    assert result.numbers[module.IDENTITY_KEY]["n"] == 24  # every group of the three seeds
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    # broken on purpose: the measurement disagrees with the closed form on some group
    assert build((1.3, 1.2, 1.25), gap=1e-3).verdict == "not reproduced"
    # the std normaliser down-weights the edge groups: interval below 1
    assert build((0.8, 0.85, 0.9)).verdict == "not reproduced"
    # an interval covering 1: inconclusive
    assert build((1.3, 0.7, 1.0)).verdict == "inconclusive"
    # a seed without edge groups is not measured: 2 measured seeds < 3, inconclusive
    assert build((1.3, 1.29, math.nan)).verdict == "inconclusive"  # two seeds alone would be above 1


# ---------------------------------------------------------------- chain of thought (issue 51)
def cot_rows(grpo_inc, dr_inc, signal=(3, 3)):
    row = lambda inc, informative: {"reward first": 0.1, "reward last": 0.2,  # noqa: E731
                                    "informative groups": float(informative), "d length_correct": 0.0,
                                    "d length_incorrect": inc}
    return {"grpo": row(grpo_inc, signal[0]), "dr_grpo": row(dr_inc, signal[1])}


def cot(module, diffs, signals=((3, 3),) * 3):
    per_seed = {301 + i: cot_rows(10.0 + d, 10.0, sig) for i, (d, sig) in enumerate(zip(diffs, signals))}
    return module.deciding_result(per_seed, max_tokens=64, setting="s", command="c", wall_s=1.0)


def test_chain_of_thought_informative_groups_by_hand():
    module = experiment_module("chain_of_thought")
    groups = [{"rewards": [[0, 0, 0, 0], [1, 0, 0, 0]], "lengths": [[5, 6, 7, 8], [1, 2, 3, 4]]},
              {"rewards": [[1, 1, 1, 1], [0, 0.5, 0, 0]], "lengths": [[5, 6, 7, 8], [1, 2, 3, 4]]}]
    assert module.informative_groups(groups) == 2
    row = module.seed_row(groups)  # incorrect lengths: step 1 (5+6+7+8+2+3+4)/7 = 5, step 2 (1+2+3+4)/4 = 2.5
    assert row["d length_incorrect"] == pytest.approx(2.5 - 5.0) and row["reward first"] == pytest.approx(1 / 8)


def test_chain_of_thought_rule_tells_no_effect_from_not_measured():
    module = experiment_module("chain_of_thought")
    result = cot(module, (2.0, 3.0, 4.0))  # mean 3, sd 1: [3 -+ 4.303 / sqrt 3]
    diff = result.numbers[module.DIFF_KEY]
    half = T_975_2 / math.sqrt(3)
    assert (diff["mean"], diff["low"], diff["high"]) == pytest.approx((3.0, 3.0 - half, 3.0 + half))
    assert result.numbers[module.MARGIN_KEY]["mean"] == pytest.approx(3.2)  # 5% of 64 tokens
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    # no effect, measured: [-1.24, +1.24] inside +-3.2 -> not reproduced
    assert cot(module, (-0.5, 0.0, 0.5)).verdict == "not reproduced"
    # the same numbers without a learning signal (every reward equal in one recipe's runs): not measured
    unmeasured = cot(module, (-0.5, 0.0, 0.5), signals=((0, 3),) * 3)
    assert unmeasured.verdict == "inconclusive" and unmeasured.seeds == () and unmeasured.headline == module.SIGNAL_KEY
    assert unmeasured.excluded == {s: "no learning signal: grpo saw no group with differing rewards"
                                   for s in ("301", "302", "303")}
    # one seed without a signal: 2 counted < 3
    assert cot(module, (3.0, 3.0, 3.1), signals=((3, 3), (3, 0), (3, 3))).verdict == "inconclusive"  # 2 alone: above 0
    # shorter under GRPO: below 0; too wide to tell: inconclusive
    assert cot(module, (-4.0, -5.0, -6.0)).verdict == "not reproduced"
    assert cot(module, (-5.0, 0.0, 5.0)).verdict == "inconclusive"


def test_sanity_check_rule_on_hand_made_runs():
    """Every run of 3 seeds x 3 precisions reaches 0.9 and fp16 never skips: reproduced; the numbers
    (last-5 mean, first step at 0.9, share) are the hand-counted ones."""
    module = experiment_module("sanity_check")

    def records(rewards, skipped=0.0):
        return [{"step": i + 1, "reward": r, "skipped": skipped} for i, r in enumerate(rewards)]

    learned = [0.2, 0.5, 0.95, 0.97, 0.98, 1.0, 1.0]  # last 5: (0.95 + 0.97 + 0.98 + 1 + 1) / 5 = 0.98; first: step 3
    runs = {(p, s): records(learned) for p in module.PRECISIONS for s in (7, 8, 9)}
    result = module.deciding_result(runs, setting="hand-made", command="-", wall_s=0.0)
    assert result.verdict == "reproduced" and result.seeds == (7, 8, 9)
    assert result.numbers["bf16 reward, last 5 steps"]["mean"] == pytest.approx(0.98)
    assert result.numbers["fp16 first step >= 0.9"]["mean"] == 3.0
    assert (result.numbers[module.SHARE_KEY]["mean"], result.numbers[module.SHARE_KEY]["n"]) == (1.0, 9)
    stuck = {**runs, ("bf16", 8): records([0.2, 0.5, 0.6, 0.7, 0.8, 0.85, 0.89])}  # 8 of 9 reach it
    assert module.deciding_result(stuck, setting="", command="-", wall_s=0.0).verdict == "inconclusive"
    skipping = {**runs, ("fp16", 9): records(learned, skipped=1.0)}  # one fp16 update skipped at each step
    got = module.deciding_result(skipping, setting="", command="-", wall_s=0.0)
    assert got.verdict == "inconclusive" and got.numbers[module.SKIPPED_KEY]["mean"] == 7.0
    failing = {run: records([0.1] * 7) if run[1] != 7 else records(learned) for run in runs}  # 3 of 9
    assert module.deciding_result(failing, setting="", command="-", wall_s=0.0).verdict == "not reproduced"
    two_seeds = {run: r for run, r in runs.items() if run[1] != 9}
    assert module.deciding_result(two_seeds, setting="", command="-", wall_s=0.0).verdict == "inconclusive"


def test_length_bias_powered_rule_sizes_its_seeds_and_tells_no_effect_from_not_measured():
    """POWERED_RULE (issue 51): 18 seeds for 80% power at 3 tokens with sd 4.22 (normal approximation
    (2.80 x 4.22 / 3)^2 = 15.5, plus the t-test's ~2); reproduced above 0; not reproduced below 0 or
    inside +-3 tokens; fewer than 18 seeds or an interval across a margin: inconclusive."""
    module = experiment_module("length_bias")
    assert module.POWERED_SEED_COUNT == 18 and module.POWERED_SEEDS == tuple(range(20, 38))
    assert not set(module.POWERED_SEEDS) & {0, 1, 2, *module.DECIDING_SEEDS}  # fresh
    judge = lambda *a: module.powered_verdict(module.stats.Interval(*a))  # noqa: E731
    assert judge(2.0, 0.5, 3.5, 18) == "reproduced"
    assert judge(-2.0, -3.5, -0.5, 18) == "not reproduced"
    assert judge(0.4, -1.5, 2.3, 18) == "not reproduced"  # inside +-3: no bias as large as planned
    assert judge(1.0, -1.2, 3.2, 18) == "inconclusive"  # crosses +3
    assert judge(0.4, -1.5, 2.3, 17) == "inconclusive"  # a seed short of the plan
    result = module.deciding_result(
        {r: [{"d length_incorrect": x, "d length_correct": 0.0, "reward last": 0.9} for x in xs]
         for r, xs in (("grpo", [1.0] * 9 + [2.0] * 9), ("dr_grpo", [0.0] * 18))},
        module.POWERED_SEEDS, setting="s", command="c", wall_s=1.0, powered=True)
    # differences 1 x 9, 2 x 9: mean 1.5, sd 0.5145, half width t_{0.975,17} 0.5145 / sqrt(18) = 0.2559
    diff = result.numbers["grpo - dr_grpo d length_incorrect"]
    assert (diff["low"], diff["high"]) == pytest.approx((1.5 - 0.2559, 1.5 + 0.2559), abs=2e-4)
    assert result.verdict == "reproduced" == module.rule_verdict(result.numbers)
    assert result.verdict_rule == module.POWERED_RULE


def test_learning_rule_reads_direction_and_equivalence_margin():
    """experiments/learning_rule.py (issue 62's learning runs) on hand-made intervals and per-step values."""
    rule = experiment_module("learning_rule")
    from jaxrl_llm.reports.stats import Interval

    assert rule.window_change([0.1, 0.2, 0.3, 0.5, 0.6, 0.7, 0.9], window=3) == pytest.approx((0.6 + 0.7 + 0.9) / 3 - 0.2)
    assert math.isnan(rule.window_change([0.1, 0.2, 0.3, 0.4, 0.5], window=3))  # windows would overlap
    assert rule.reading(Interval(0.2, 0.1, 0.3, 3), "up") == "reproduced"
    assert rule.reading(Interval(0.2, 0.1, 0.3, 3), "down") == "not reproduced"  # wholly on the wrong side
    assert rule.reading(Interval(-0.2, -0.3, -0.1, 3), "down") == "reproduced"
    assert rule.reading(Interval(0.0, -0.04, 0.04, 3), "up") == "not reproduced"  # inside +-0.05: no effect
    assert rule.reading(Interval(0.0, -0.06, 0.04, 3), "up") == "inconclusive"  # crosses the margin
    assert rule.reading(Interval(0.2, 0.1, 0.3, 2), "up") == "inconclusive"  # fewer than 3 seeds
    assert rule.combined(["reproduced", "reproduced"]) == "reproduced"
    assert rule.combined(["reproduced", "inconclusive"]) == "inconclusive"
    assert rule.combined(["inconclusive", "not reproduced"]) == "not reproduced"


def test_gem_learning_counts_successes_and_format_errors_per_step():
    module = experiment_module("gem_learning")
    # six steps of 2 games x 2 episodes; GEM's sums: 1.0 won, -0.1 format error, 0.0 / 0.56 neither
    steps = [[[-0.1, -0.1], [-0.1, 0.0]], [[-0.1, 1.0], [-0.1, -0.1]], [[-0.1, 0.56], [-0.1, 0.0]],
             [[1.0, 1.0], [0.0, -0.1]], [[1.0, 0.0], [0.56, 0.0]], [[1.0, 1.0], [1.0, -0.1]]]
    groups = [{"step": i + 1, "rewards": r} for i, r in enumerate(steps)]
    success, errors = module.step_shares(groups)
    assert success == [0, 0.25, 0, 0.5, 0.25, 0.75] and errors == [0.75, 0.75, 0.5, 0.25, 0, 0.25]
    numbers = module.seed_numbers(groups)
    assert numbers[module.SUCCESS] == pytest.approx(1.5 / 3 - 0.25 / 3)
    assert numbers[module.FORMAT] == pytest.approx(0.5 / 3 - 2.0 / 3)
    up, down = iv(0.3, 0.1, 0.5, 3), iv(-0.3, -0.5, -0.1, 3)
    assert module.rule_verdict({module.SUCCESS: up, module.FORMAT: down}) == "reproduced"
    assert module.rule_verdict({module.SUCCESS: up, module.FORMAT: iv(0.0, -0.2, 0.2, 3)}) == "inconclusive"


def test_judge_learning_reports_reward_hacking_when_only_the_judge_rises():
    module = experiment_module("judge_learning")
    numbers = module.seed_numbers({"judge": 0.2, "exact": 0.3}, {"judge": 0.5, "exact": 0.25})
    assert numbers[module.JUDGE] == pytest.approx(0.3) and numbers[module.GRADER] == pytest.approx(-0.05)
    hacked = {module.JUDGE: iv(0.3, 0.1, 0.5, 3), module.GRADER: iv(0.0, -0.1, 0.1, 3)}
    assert module.rule_verdict(hacked) == "reproduced" and module.reward_hacking(hacked)
    honest = {module.JUDGE: iv(0.3, 0.1, 0.5, 3), module.GRADER: iv(0.2, 0.1, 0.3, 3)}
    assert module.rule_verdict(honest) == "reproduced" and not module.reward_hacking(honest)
    flat = {module.JUDGE: iv(0.0, -0.02, 0.02, 3), module.GRADER: iv(0.0, -0.1, 0.1, 3)}
    assert module.rule_verdict(flat) == "not reproduced" and not module.reward_hacking(flat)
