"""The four experiments of experiments/ in reduced form (a tiny random decoder with
SmolLM2's tokenizer, 2 steps, the JAX sampler), and their analysis functions on
hand-built groups whose expected numbers are derived here by hand."""
import json
import math

import numpy as np
import pytest

from jaxrl_llm.reports import bias_report, difficulty
from jaxrl_llm.reports.precision import matched_ratios
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.run.metrics import read_groups, read_metrics
from jaxrl_llm.train.run.provenance import read_run_info
from jaxrl_llm.train.run.plots import plot_runs
from tests.experiments.experiment_helpers import TINY, load_experiment, png_shape



# ------------------------------------------------------------------ length bias
@pytest.mark.slow  # 54 s, make test-all since 2026-11-29 (make test time)
def test_length_bias_reduced_runs_three_recipes_from_one_seed_and_reruns_keep_them(tiny_model_dir, tmp_path,
                                                                                      capsys):
    exp = load_experiment("length_bias")
    args = ["--quick", "--out", str(tmp_path), f"model.source={tiny_model_dir}", *TINY]
    assert exp.main(args) == 0
    runs = [tmp_path / f"{r}_s0" for r in ("grpo", "dr_grpo", "dapo")]  # --quick: seed 0 only
    metrics = [read_metrics(r) for r in runs]
    groups = [read_groups(r) for r in runs]
    assert [len(m) for m in metrics] == [2, 2, 2]
    # Same seed and same initial weights: step 1 samples the same completions in every run.
    assert groups[0][0] == groups[1][0] == groups[2][0]
    # groups.jsonl and metrics.jsonl are two records of the same samples.
    for m, g in zip(metrics, groups):
        for step_metrics, step_groups in zip(m, g):
            assert np.mean(step_groups["lengths"]) == pytest.approx(step_metrics["length_mean"], rel=1e-6)
            assert np.mean(step_groups["rewards"]) == pytest.approx(step_metrics["reward"], rel=1e-6)
    summary = json.loads((tmp_path / "summary.json").read_text())
    for row, g in zip(summary["rows"], groups):  # window = 1 step at 2 steps; all answers are wrong here
        first, last = np.mean(g[0]["lengths"]), np.mean(g[-1]["lengths"])
        seed0 = row["per seed"][0]
        assert seed0["n incorrect first"] == 8 and seed0["d length_incorrect"] == pytest.approx(last - first)
        interval = row["d length_incorrect interval"]  # one seed: its value, no interval
        assert interval["n"] == 1 and interval["mean"] == pytest.approx(last - first) and math.isnan(interval["low"])
    assert any("--quick uses 1 of the full size's 3 seeds" in n for n in summary["notes"])
    assert png_shape(tmp_path / "seeds.png")[0] > 100
    assert png_shape(tmp_path / "training.png")[0] > 100
    assert png_shape(tmp_path / "analytic" / "length_bias.png")[0] > 100
    # Each run records its config, commit and versions next to its metrics.
    info = read_run_info(runs[1])
    assert info["config"]["recipe"]["name"] == "dr_grpo" and info["git_commit"] and info["versions"]["jax"]

    before = [(r / "metrics.jsonl").read_text() for r in runs]
    capsys.readouterr()
    assert exp.main(args) == 0  # the same command again: finished runs are kept, not redone
    assert capsys.readouterr().out.count("finished earlier") == 3
    assert [(r / "metrics.jsonl").read_text() for r in runs] == before
    with pytest.raises(ConfigError, match="different config"):
        exp.main([*args, "train.lr=5e-4"])


def test_length_bias_gpu_config_and_bad_scale():
    exp = load_experiment("length_bias")
    cfg = exp.get_config("grpo,gpu")
    assert (cfg.rollout.engine, cfg.rollout.max_tokens, cfg.rollout.samples_per_prompt) == ("vllm", 3000, 8)
    assert cfg.recipe.name == "grpo" and cfg.task.name == "jsonl" and cfg.task.jsonl_path is None
    from jaxrl_llm.train.sample.prompts import task_from_config

    with pytest.raises(ConfigError, match=r"task.name = 'jsonl' needs task.jsonl_path"):
        task_from_config(cfg)  # the data set is the user's: refused until named, before any model loads
    with pytest.raises(ConfigError, match="valid: none or 'gpu'"):
        exp.get_config("grpo,tpu")


def test_analytic_view_on_logged_groups_gives_grpo_1_over_L_and_no_length_dependence_otherwise():
    """Hand-built groups with lengths 2..40: GRPO's per-token weight is A/(N L) (slope -1 on
    log-log axes); Dr. GRPO's A/(N L_const) and DAPO's A/sum(L) do not depend on L (slope 0)."""
    rng = np.random.default_rng(3)
    records = [{"step": s, "rewards": [[1, 0, 0, 1], [0, 1, 0, 0]],
                "lengths": rng.integers(2, 41, size=(2, 4)).tolist()} for s in (1, 2, 3)]
    batch = bias_report.batch_from_groups(records, max_length=40)
    assert batch.rewards.shape == (6, 4) and batch.lengths.shape == (24,)
    exponents = {}
    for name in ("grpo", "dr_grpo", "dapo"):
        weights, advantages = bias_report.measured_token_weights(name, batch)
        exponents[name] = bias_report.length_exponent(batch.lengths.astype(float), weights, advantages)
    assert exponents["grpo"] == pytest.approx(-1.0, abs=1e-4)
    assert exponents["dr_grpo"] == pytest.approx(0.0, abs=1e-4)
    assert exponents["dapo"] == pytest.approx(0.0, abs=1e-4)


# --------------------------------------------------------------- difficulty bias
def test_difficulty_weights_on_real_groups_match_the_hand_derived_values():
    """G = 8. p = 1/8: E|A| = 2 (1/8)(7/8) = 0.21875 without std; with the ddof=1 std
    sqrt(8/7 * 7/64) = sqrt(1/8) it is 0.21875 / 0.353553 = 0.618718. p = 1/2: 0.5 and
    0.5 / sqrt(8/7 / 4) = 0.935414. With seq-mean-token-mean each response's total push
    is |A_i| / N, so a group's share of the step's gradient is sum_g |A| / sum_all |A|."""
    rewards = [[1, 0, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0, 0, 0]]
    lengths = [[3, 5, 7, 9, 2, 4, 6, 8], [1, 2, 3, 4, 5, 6, 7, 8]]
    result = difficulty.measure([{"step": 1, "rewards": rewards, "lengths": lengths}])
    rows = {r["p"]: r for r in result["rows"]}
    assert rows[0.125]["measured no_std"] == pytest.approx(0.21875, rel=1e-5)
    assert rows[0.125]["measured std"] == pytest.approx(0.21875 / math.sqrt(1 / 8), rel=1e-4)
    assert rows[0.5]["measured std"] == pytest.approx(0.5 / math.sqrt(8 / 7 / 4), rel=1e-4)
    for row in (rows[0.125], rows[0.5]):
        assert row["analytic std"] == pytest.approx(row["measured std"], rel=1e-4)
        assert row["analytic no_std"] == pytest.approx(row["measured no_std"], rel=1e-5)
    no_std_total = 8 * 0.21875 + 8 * 0.5
    std_total = 8 * 0.618718 + 8 * 0.935414
    assert rows[0.125]["grad share no_std"] == pytest.approx(8 * 0.21875 / no_std_total, rel=1e-4)
    assert rows[0.125]["grad share std"] == pytest.approx(8 * 0.618718 / std_total, rel=1e-4)
    assert rows[0.125]["share ratio std/no_std"] == pytest.approx(
        (8 * 0.618718 / std_total) / (8 * 0.21875 / no_std_total), rel=1e-4)
    assert rows[0.0]["groups"] == 0 and rows[0.125]["groups"] == 1 and rows[0.5]["groups"] == 1


def test_difficulty_experiment_on_a_fake_logged_run(tmp_path):
    """The experiment's command on a hand-written groups.jsonl (a fake run: no model)."""
    fake_run = tmp_path / "fake_run"
    fake_run.mkdir()
    rng = np.random.default_rng(0)
    with open(fake_run / "groups.jsonl", "w") as f:
        for step in (1, 2, 3):
            rewards = (rng.uniform(size=(4, 8)) < rng.uniform(size=(4, 1))).astype(float)
            f.write(json.dumps({"step": step, "rewards": rewards.tolist(),
                                "lengths": rng.integers(1, 20, size=(4, 8)).tolist()}) + "\n")
    out = tmp_path / "out"
    assert load_experiment("difficulty_bias").main(["--out", str(out), "--runs", str(fake_run)]) == 0
    rows = json.loads((out / "summary.json").read_text())["rows"]
    assert sum(r["groups"] for r in rows) == 12
    for r in rows:  # the plotted analytic curve is the closed form
        p = r["p"]
        assert r["analytic no_std"] == pytest.approx(2 * p * (1 - p))
    assert png_shape(out / "difficulty_bias.png")[1] > 500


@pytest.mark.slow  # 21 s, make test-all since 2026-11-29 (make test time); the weights by hand and a fake logged run stay
def test_difficulty_experiment_samples_groups_per_seed_and_writes_its_result(tiny_model_dir, tmp_path):
    """The deciding command's path on the tiny random decoder: per seed 3 batches of 8 x 8 sampled and
    graded into base_s<seed>/groups.jsonl (kept on a rerun), one replicate per seed in the result."""
    exp = load_experiment("difficulty_bias")
    out, results = tmp_path / "out", tmp_path / "result.json"
    argv = ["--quick", "--out", str(out), "--seeds", "5,6", "--results", str(results), f"model.source={tiny_model_dir}",
            "rollout.max_tokens=4"]
    assert exp.main(argv) == 0
    groups = read_groups(out / "base_s5")
    assert [g["step"] for g in groups] == [1, 2, 3] and np.asarray(groups[0]["rewards"]).shape == (8, 8)
    assert max(max(row) for g in groups for row in g["lengths"]) <= 4
    stored = json.loads(results.read_text())
    assert stored["source"] == "run" and stored["seeds"] == [5, 6] and stored["wall_s"] > 0
    assert stored["numbers"]["groups"]["mean"] == 24  # 3 batches x 8 prompts per seed
    assert stored["verdict"] == "inconclusive"  # 2 seeds, below the rule's 3: never decided
    before = (out / "base_s5" / "groups.jsonl").read_text()
    assert exp.main(argv) == 0 and (out / "base_s5" / "groups.jsonl").read_text() == before


# ----------------------------------------------------------- precision mismatch
@pytest.mark.slow  # 36 s, make test-all since 2026-11-29 (make test time); the ratios by hand stay
def test_precision_reduced_with_the_jax_sampler(tiny_model_dir, tmp_path):
    """fp32 sampler vs fp32 learner differ by float32 kernel noise only; every pair
    involving bfloat16 differs by bf16 rounding (8 mantissa bits), i.e. far more."""
    exp = load_experiment("precision_mismatch")
    assert exp.main(["--quick", "--out", str(tmp_path), "--model", tiny_model_dir, "--engines", "jax",
                     "prompts=2", "samples=2", "max_tokens=6"]) == 0
    result = json.loads((tmp_path / "mismatch.json").read_text())
    rows = {(r["sampler"], r["learner"]): r for r in result["rows"]}
    assert len(rows) == 9 and all(r["tokens"] == 2 * 2 * 6 for r in rows.values())
    exact = rows[("jax:fp32", "fp32")]
    assert exact["max_abs_logprob_diff"] < 1e-4 and abs(exact["k1"]) < 1e-5
    assert rows[("jax:bf16", "fp32")]["max_abs_logprob_diff"] > 10 * exact["max_abs_logprob_diff"]
    assert rows[("jax:fp32", "bf16")]["max_abs_logprob_diff"] > 10 * exact["max_abs_logprob_diff"]
    for r in rows.values():
        assert r["k3"] >= 0.0 and r["prob_diff_min"] <= r["prob_diff_max"]
    for name in ("prob_scatter.png", "seq_log_ratio_vs_length.png", "kl_grid.png"):
        assert png_shape(tmp_path / name)[0] > 100


def test_matched_ratios_by_hand():
    rows = [{"sampler": "vllm:bf16", "learner": "bf16", "matched": True, "k1": 2e-3, "k3": 1e-3,
             "max_abs_logprob_diff": 0.4},
            {"sampler": "vllm:fp16", "learner": "fp16", "matched": True, "k1": 1e-4, "k3": 4e-5,
             "max_abs_logprob_diff": 0.1},
            {"sampler": "vllm:fp16", "learner": "bf16", "matched": False, "k1": 1.0, "k3": 1.0,
             "max_abs_logprob_diff": 1.0}]
    assert matched_ratios(rows) == {"vllm": pytest.approx({"k1": 20.0, "k3": 25.0, "max_abs_logprob_diff": 4.0})}


@pytest.mark.slow
def test_precision_with_the_real_vllm_server_fp32_and_bf16(tiny_model_dir, tmp_path):
    """vLLM CPU at float32 matches the float32 learner to kernel noise; bfloat16 does not."""
    exp = load_experiment("precision_mismatch")
    assert exp.main(["--quick", "--out", str(tmp_path), "--model", tiny_model_dir, "--engines", "vllm",
                     "prompts=2", "samples=2", "max_tokens=6"]) == 0
    rows = {(r["sampler"], r["learner"]): r for r in json.loads((tmp_path / "mismatch.json").read_text())["rows"]}
    assert rows[("vllm:fp32", "fp32")]["max_abs_logprob_diff"] < 2e-3
    assert rows[("vllm:bf16", "fp32")]["max_abs_logprob_diff"] > rows[("vllm:fp32", "fp32")]["max_abs_logprob_diff"]


# ------------------------------------------------------------------ sanity check
@pytest.mark.slow  # 70 s; make test keeps the precision experiment's reduced run
def test_sanity_check_reduced_runs_each_precision(tiny_model_dir, tmp_path):
    exp = load_experiment("sanity_check")
    assert exp.main(["--quick", "--out", str(tmp_path), "--seeds", "0", "--results", str(tmp_path / "result.json"),
                     f"model.source={tiny_model_dir}", *TINY]) == 0
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert [r["precision"] for r in rows] == ["fp32", "bf16", "fp16"]
    stored = json.loads((tmp_path / "result.json").read_text())
    assert (stored["source"], stored["seeds"], stored["verdict"]) == ("run", [0], "inconclusive")  # 1 seed < 3
    assert stored["numbers"][exp.SHARE_KEY]["n"] == 3 and stored["wall_s"] > 0
    for row in rows:
        records = read_metrics(tmp_path / f"{row['precision']}_s0")
        info = read_run_info(tmp_path / f"{row['precision']}_s0")
        assert info["config"]["train"]["precision"] == row["precision"]
        assert row["seeds"] == 1 and row["per seed"][0]["steps"] == len(records) == 2
        assert row["reward last 2 interval"]["mean"] == pytest.approx(np.mean([r["reward"] for r in records]))
    # A fp32 sampler matches the fp32 learner far more closely than bf16 ones match theirs.
    k3 = {r["precision"]: r["per seed"][0]["mean mismatch k3"] for r in rows}
    assert k3["fp32"] < 1e-6
    assert png_shape(tmp_path / "seeds.png")[0] > 100
    fig = plot_runs([tmp_path / p for p in ("fp32_s0", "bf16_s0")], ["reward"], tmp_path / "x.png")
    commit = read_run_info(tmp_path / "fp32_s0")["git_commit"][:10]
    assert any(commit in t.get_text() for t in fig.texts)  # the plot reads run_info: commit in the footer
    with pytest.raises(ConfigError, match="valid: one of"):
        exp.get_config("fp8")


@pytest.mark.slow
def test_ppo_addition_reduced_writes_before_after_and_critic_metrics(tiny_model_dir, tmp_path):
    ppo = load_experiment("ppo_addition")
    assert ppo.get_config().recipe.name == "ppo" and ppo.get_config().critic.warmup_steps == 1
    assert ppo.main(["--quick", "--out", str(tmp_path), f"model.source={tiny_model_dir}", "total_steps=2",
                     "rollout.max_tokens=6", "task.eval_size=4"]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert 0.0 <= summary["before_pass@1"] <= 1.0 and 0.0 <= summary["after_pass@1"] <= 1.0
    assert summary["questions"] == 4 and [r["step"] for r in summary["per_step"]] == [1, 2]
    assert all(math.isfinite(r["value_loss"]) for r in summary["per_step"])
    assert summary["per_step"][0]["value_mean"] == 0.0  # the zero-initialised head at step 1


def test_multi_turn_configs_hold_out_examples_and_two_proportions_by_hand():
    from jaxrl_llm.train.sample.prompts import heldout_examples, task_from_config

    mt = load_experiment("multi_turn")
    guess = mt.get_config("guess_number")
    heldout = heldout_examples(task_from_config(guess), guess.task.eval_size, guess.seed)
    assert sorted(int(e.answer) for e in heldout) == [1, 4]
    calc = mt.get_config("calculator_tool")
    assert len(heldout_examples(task_from_config(calc), calc.task.eval_size, calc.seed)) == calc.task.eval_size == 16
    with pytest.raises(ValueError, match="unknown environment 'maze'; valid: calculator_tool, guess_number"):
        mt.get_config("maze")
    # 8/64 -> 20/64: pooled p = 28/128, se0 = sqrt(p (1 - p) (2/64)) = 0.073080, z = 0.1875 / se0.
    test = mt.two_proportions(8, 64, 20, 64)
    assert test["diff"] == pytest.approx(0.1875) and test["z"] == pytest.approx(2.56571, abs=1e-4)
    assert test["p_value"] == pytest.approx(0.010297, abs=1e-5)  # 2 (1 - Phi(2.5657))
    se = math.sqrt(0.125 * 0.875 / 64 + 0.3125 * 0.6875 / 64)
    assert test["ci95"] == pytest.approx([0.1875 - 1.96 * se, 0.1875 + 1.96 * se])
    assert mt.two_proportions(0, 10, 0, 10)["p_value"] == 1.0  # no successes on either side


@pytest.mark.slow  # a tiny decoder: before-eval, 1 training step, after-eval; ~40 CPU-s (94 s wall at load 5)
def test_multi_turn_reduced_writes_before_after_counts(tiny_model_dir, tmp_path):
    mt = load_experiment("multi_turn")
    out = mt.main("guess_number", [f"model.source={tiny_model_dir}", f"run_dir={tmp_path}", "total_steps=1",
                                   "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
                                   "task.eval_samples=3", "train.micro_batch_size=8"])
    saved = json.loads((tmp_path / "before_after.json").read_text())
    assert saved["steps"] == 1 and saved["before"]["episodes"] == saved["after"]["episodes"] == 2 * 3
    for side in ("before", "after"):
        assert 0 <= saved[side]["solved"] <= 6 and 1 <= saved[side]["episode_turns"] <= 4
        assert saved[side]["pass@1"] == pytest.approx(saved[side]["solved"] / 6)
    assert out["test"]["diff"] == pytest.approx((saved["after"]["solved"] - saved["before"]["solved"]) / 6)
