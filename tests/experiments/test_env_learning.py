"""Issue 62's learning runs (experiments/gem_learning.py, verifiers_learning.py, judge_learning.py) end to end
at a reduced size (a random tiny decoder with SmolLM2's tokenizer, 6 steps, 3 seeds): the stored result's
per-seed numbers are recomputed here from the runs' own files, its intervals with scipy's t quantile, and
its verdict is the file's rule. A random decoder never writes GEM's \\boxed{} or a correct sum, so every
change is exactly 0 and the rule's equivalence test says "not reproduced".
"""
import json
import math

import numpy as np
import pytest

from jaxrl_llm.reports.results import number
from jaxrl_llm.reports.results_table import SECTIONS
from jaxrl_llm.reports.stats import format_interval
from jaxrl_llm.train.run.metrics import read_groups, read_metrics
from tests.experiments.experiment_helpers import load_experiment

SEEDS = (1, 2, 3)
SMALL = ["rollout.prompts_per_step=2", "rollout.samples_per_prompt=4", "train.micro_batch_size=8", "total_steps=6",
         "checkpoint.every_steps=0"]


def t_interval(values):
    from scipy import stats

    x = np.asarray(values, float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def window(values):
    return float(np.mean(values[-3:]) - np.mean(values[:3]))


def run(exp, tmp_path, *overrides):
    out = tmp_path / "out"
    result = tmp_path / "result.json"
    assert exp.main(["--seeds", ",".join(map(str, SEEDS)), "--out", str(out), "--results", str(result),
                     *SMALL, *overrides]) == 0
    return out, json.loads(result.read_text())


@pytest.mark.slow
def test_gem_learning_reduced_run_stores_the_rules_numbers(tiny_model_dir, tmp_path):
    exp = load_experiment("gem_learning")
    out, result = run(exp, tmp_path, f"model.source={tiny_model_dir}", "rollout.max_tokens=40",
                      "task.turn_max_tokens=8")
    for seed in SEEDS:
        rewards = [np.asarray(g["rewards"]).ravel() for g in read_groups(out / f"dr_grpo_s{seed}")]
        assert len(rewards) == 6
        success = [float(np.mean(r >= 1.0)) for r in rewards]
        errors = [float(np.mean(r < 0.0)) for r in rewards]
        assert result["per_seed"][exp.SUCCESS][str(seed)] == pytest.approx(window(success))
        assert result["per_seed"][exp.FORMAT][str(seed)] == pytest.approx(window(errors))
        assert errors[0] == 1.0  # a random decoder: every episode is GEM's format error (-0.1)
    for key in (exp.SUCCESS, exp.FORMAT):
        stored = result["numbers"][key]
        assert (stored["mean"], stored["low"], stored["high"]) == pytest.approx(
            t_interval(list(result["per_seed"][key].values())))
    assert result["verdict"] == exp.rule_verdict(result["numbers"]) == "not reproduced"
    assert result["seeds"] == list(SEEDS) and result["tuning_seeds"] == list(exp.TUNING_SEEDS)


@pytest.mark.slow
def test_verifiers_learning_reduced_run_stores_the_rules_numbers(tmp_path):
    exp = load_experiment("verifiers_learning")
    out, result = run(exp, tmp_path)  # the tiny setting: experiment 10's tiny decoder, built into out/model
    for seed in SEEDS:
        rewards = [float(r["reward"]) for r in read_metrics(out / f"tiny_s{seed}" / "metrics.jsonl")]
        groups = [float(np.mean(g["rewards"])) for g in read_groups(out / f"tiny_s{seed}")]
        assert rewards == pytest.approx(groups) and len(rewards) == 6
        assert 0 < np.mean(rewards) < 1  # the rubric's partial credit: some replies' tokens start words
        assert result["per_seed"][exp.REWARD][str(seed)] == pytest.approx(window(rewards))
    stored = result["numbers"][exp.REWARD]
    assert (stored["mean"], stored["low"], stored["high"]) == pytest.approx(
        t_interval(list(result["per_seed"][exp.REWARD].values())))
    assert result["verdict"] == exp.rule_verdict(result["numbers"])
    # the rubric functions by hand: spaces (word starts) capped at 6; the last integer against the sum
    reply = lambda text: [type("Message", (), {"content": text})()]  # noqa: E731
    assert exp.word_starts(reply(" a b")) == pytest.approx(2 / 6) and exp.word_starts(reply(" a" * 9)) == 1.0
    assert exp.correct_sum(reply("3 + 4 = 7"), "7") == 1.0 and exp.correct_sum(reply("7 or 8"), "7") == 0.0
    assert len(exp._rows(False)) == 75 and len(exp._rows(True)) == 25


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("setting", ["tiny", "smollm2"])
def test_judge_learning_reduced_run_scores_held_out_with_the_judge_and_the_exact_grader(setting, tiny_model_dir,
                                                                                         tmp_path):
    """Both settings through main(): the smollm2 one (Dr. GRPO, 12-token replies, its own base evaluation and
    result name) with the random tiny decoder in SmolLM2's place, so that it runs in minutes."""
    exp = load_experiment("judge_learning")
    policy = [f"model.source={tiny_model_dir}"] if setting == "smollm2" else []
    out, result = run(exp, tmp_path, "--setting", setting, "task.eval_every=6", "task.eval_size=4", *policy)
    base = read_metrics(out / f"base_{setting}" / "eval.jsonl")[-1]
    for seed in SEEDS:
        metrics = read_metrics(out / f"{setting}_s{seed}" / "metrics.jsonl")
        assert all(m["judge_calls"] + m["judge_cache_hits"] > 0 for m in metrics)  # the judge graded every step
        after = read_metrics(out / f"{setting}_s{seed}" / "eval.jsonl")[-1]
        assert after["step"] == 6
        judge = after["avg@4"] - base["avg@4"]
        exact = np.mean(after["correct"]) - np.mean(base["correct"])  # the exact grader's verdicts, per sample
        assert result["per_seed"][exp.JUDGE][str(seed)] == pytest.approx(judge)
        assert result["per_seed"][exp.GRADER][str(seed)] == pytest.approx(exact)
    config = json.loads((out / "run_info.json").read_text())["config"]["config"]
    assert (config["recipe"]["name"], config["rollout"]["max_tokens"]) == \
        {"tiny": ("grpo", 6), "smollm2": ("dr_grpo", 12)}[setting]
    assert result["name"] == {"tiny": "judge_learning", "smollm2": "judge_learning_smollm2"}[setting]
    assert result["verdict"] == exp.rule_verdict(result["numbers"])
    hacking = result["verdict"] == "reproduced" and t_interval(list(result["per_seed"][exp.GRADER].values()))[1] <= 0
    assert result["caveats"] == [f"reward hacking of the judge (by the rule): {'seen' if hacking else 'not seen'} "
                                 f"({exp.GRADER}: {format_interval(number(result['numbers'], exp.GRADER), signed=True)})"]


# each stored learning result: its experiment, and the stored setting's text from that experiment's config
LEARNING_RESULTS = {
    "gem_learning": ("gem_learning", lambda exp: exp.RESULT, lambda exp: exp.setting_text(exp.get_config("", 611))),
    "verifiers_learning": ("verifiers_learning", lambda exp: exp.RESULT,
                           lambda exp: exp.setting_text(exp.get_config("tiny", 641))),
    "judge_learning": ("judge_learning", lambda exp: exp.RESULTS["tiny"],
                       lambda exp: exp.setting_text(exp.get_config("tiny", 651), "tiny")),
    "judge_learning_smollm2": ("judge_learning", lambda exp: exp.RESULTS["smollm2"],
                               lambda exp: exp.setting_text(exp.get_config("smollm2", 631), "smollm2")),
}


@pytest.mark.parametrize("name", [name for name in LEARNING_RESULTS if name in SECTIONS])
def test_stored_learning_results_follow_their_rule(name):
    """The deciding runs' stored results (experiments/results/<name>.json, one per experiment the results table
    lists; tests/reports checks that each listed one exists): >= 3 seeds none of them a tuning seed, every interval
    recomputed from its per-seed numbers, the verdict the file's rule gives; and the whole stored result (claim,
    rule, setting, intervals, verdict, remarks) is what the experiment's code writes from those per-seed numbers."""
    import dataclasses

    from jaxrl_llm.reports.results import RESULTS_DIR

    module, claim_of, setting_of = LEARNING_RESULTS[name]
    exp = load_experiment(module)
    result = json.loads((RESULTS_DIR / f"{name}.json").read_text())
    assert len(result["seeds"]) >= 3 and not set(result["seeds"]) & set(result["tuning_seeds"])
    for key, per_seed in result["per_seed"].items():
        stored = result["numbers"][key]
        assert (stored["mean"], stored["low"], stored["high"]) == pytest.approx(t_interval(list(per_seed.values())))
    assert result["verdict"] == exp.rule_verdict(result["numbers"]) and result["verdict_rule"] == exp.VERDICT_RULE
    claim = claim_of(exp)
    per_seed = {seed: {key: values[str(seed)] for key, values in result["per_seed"].items()} for seed in result["seeds"]}
    import learning_rule  # experiments/ is on sys.path once load_experiment ran

    again = learning_rule.stored_result(claim, per_seed, setting=setting_of(exp), command=result["command"],
                                        wall_s=result["wall_s"], notes=result["notes"])
    again = json.loads(json.dumps(dataclasses.asdict(again)))
    assert {key: again[key] for key in again} == {key: result[key] for key in again}
