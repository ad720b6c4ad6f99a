"""The length-neutral experiments in reduced form: the tiny-decoder mechanism study
(experiments/length_mechanism.py) and SmolLM2's answer-first format
(experiments/length_neutral.py, here a tiny random decoder with SmolLM2's tokenizer)."""
import json

import numpy as np
import pytest

from jaxrl_llm.data import make_task
from jaxrl_llm.data.answer_first import leading_integer_reward
from jaxrl_llm.train.run.metrics import read_groups
from jaxrl_llm.train.run.provenance import read_run_info
from tests.experiments.experiment_helpers import TINY, load_experiment, png_shape


def test_answer_first_task_grades_the_leading_integer_alone():
    task = make_task("addition_answer_first")
    example = next(e for e in task.all_examples("train") if e.answer == "12")
    a, b = sorted((example.metadata["a"], example.metadata["b"]))
    if a == b:  # operands that differ, so that swapping them is a different string
        a, b = a - 1, b + 1
        example = next(e for e in task.all_examples("train") + task.all_examples("heldout")
                       if sorted((e.metadata["a"], e.metadata["b"])) == [a, b])
    assert example.prompt.startswith("What is ") and "Start your reply with the number" in example.prompt
    for text, reward in ((" 12. I added 6 and 6 and then went on at length " * 3, 1.0), ("12\n\n6+6", 1.0),
                         ("12", 1.0), ("The sum is 12", 0.0), ("120", 0.0), ("12.5", 0.0), ("13. 12", 0.0),
                         # The question's equation first: its sum is the answer (either operand order).
                         (f"{a} + {b} = 12. Then a long story" * 2, 1.0), (f" {b}+{a}=12", 1.0),
                         (f"{a} + {b} = 13. 12", 0.0), (f"{a + 1} + {b - 1} = 12", 0.0), (f"{a} + {b} = 12.5", 0.0),
                         (f"{a} + {b} is 12", 0.0)):
        assert leading_integer_reward(text, example) == reward, text
    # Same questions and split as the addition task: only the instruction and the grader differ.
    addition = make_task("addition")
    assert [e.metadata for e in task.all_examples("heldout")] == [e.metadata for e in addition.all_examples("heldout")]


@pytest.mark.slow  # 153 s at load 9 (4 arms, 48 tokens); the closed form is checked fast in test_length_drift.py
def test_length_mechanism_reduced(tmp_path):
    """2 seeds x 3 steps x 4 arms. The supervised start realises the designed policy (stop probability
    0.2 at every free position, whatever the answer); the summary's intervals are over the 2
    seeds; Dr. GRPO's closed-form force is 0 and its measured force is noise around it."""
    exp = load_experiment("length_mechanism")
    assert exp.main(["--quick", "--out", str(tmp_path), "seeds=2", "steps=3", "sft_steps=300"]) == 0
    data = json.loads((tmp_path / "per_seed.json").read_text())
    for recipe, rows in data["per_seed"].items():
        for row in rows:
            assert row["q0 right"] == pytest.approx(0.2, abs=0.05) and row["q0 wrong"] == pytest.approx(0.2, abs=0.05)
            assert abs(row["q0 right"] - row["q0 wrong"]) < 0.03  # no split at the start
    for recipe, logs in data["logs"].items():
        for log in logs:
            assert len(log["q_right"]) == 4 and len(log["force_wrong"]) == 3
            if recipe == "dr_grpo":
                assert np.abs(log["closed_wrong"]).max() < 1e-12
            if recipe == "grpo":  # wrong answers: the closed form pushes the stop logit down
                assert all(c < 0 for c in log["closed_wrong"] if c != 0)
    summary = json.loads((tmp_path / "summary.json").read_text())
    grpo = summary["rows"][0]
    assert grpo["arm"] == "grpo" and grpo["d split interval"]["n"] == 2
    splits = [r["d split"] for r in data["per_seed"]["grpo"]]
    assert grpo["d split interval"]["mean"] == pytest.approx(np.mean(splits))
    assert any("2 of the full size's 10 seeds" in n for n in summary["notes"])
    assert png_shape(tmp_path / "drift.png")[0] > 100


@pytest.mark.slow  # 6 runs (3 recipes x 2 seeds): ~1.5 min on 2 free cores, 11 min at load ~20
def test_length_neutral_reduced_two_seeds(tiny_model_dir, tmp_path):
    exp = load_experiment("length_neutral")
    assert exp.main(["--quick", "--out", str(tmp_path), "--seeds", "0,1", f"model.source={tiny_model_dir}",
                     *TINY]) == 0
    runs = {(r, s): tmp_path / f"{r}_s{s}" for r in ("grpo", "dr_grpo", "dapo") for s in (0, 1)}
    info = read_run_info(runs[("dapo", 1)])
    assert info["config"]["seed"] == 1 and info["config"]["task"]["name"] == "addition_answer_first"
    assert info["config"]["recipe"]["name"] == "dapo"
    # The same seed gives every recipe the same first step.
    assert read_groups(runs[("grpo", 0)])[0] == read_groups(runs[("dr_grpo", 0)])[0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    row = summary["rows"][0]
    expected = []
    for s in (0, 1):
        groups = read_groups(runs[("grpo", s)])
        lengths = [np.mean(np.asarray(g["lengths"])[np.asarray(g["rewards"]) < 1]) for g in groups]
        expected.append(lengths[-1] - lengths[0])
    assert row["d length_incorrect interval"]["n"] == 2
    assert row["d length_incorrect interval"]["mean"] == pytest.approx(np.mean(expected))
    # Paired rows: GRPO minus Dr. GRPO seed by seed, from the per-seed values of both rows.
    paired = next(r for r in summary["rows"] if r["recipe"] == "grpo - dr_grpo")
    diffs = []
    for s in (0, 1):  # GRPO minus Dr. GRPO at each step after the first, from the logged groups
        steps = [[np.asarray(g["lengths"], float)[np.asarray(g["rewards"]) >= 1] for g in read_groups(runs[(r, s)])]
                 for r in ("grpo", "dr_grpo")]
        per_step = [a.mean() - b.mean() for a, b in zip(steps[0][1:], steps[1][1:]) if a.size and b.size]
        diffs += [np.mean(per_step)] if per_step else []
    assert paired["length_correct interval"]["n"] == len(diffs)
    if diffs:
        assert paired["length_correct interval"]["mean"] == pytest.approx(np.mean(diffs))
    assert png_shape(tmp_path / "lengths.png")[0] > 100





def test_length_neutral_paired_differences_and_verdict():
    """Hand-built curves: the paired value of a seed is the mean over steps 2..T (both defined) of
    the recipe's length minus Dr. GRPO's; the verdict needs both intervals on the derived side of 0."""
    exp = load_experiment("length_neutral")
    nan = float("nan")

    def curve(wrong, right):
        return {"length_incorrect": [80.0, *wrong], "length_correct": [40.0, *right]}

    dr = [curve((70, 60), (30, 20)), curve((75, nan), (35, 30)), curve((60, 50), (30, 30))]
    grpo = [curve((74, 66), (10, 10)), curve((82, 70), (10, 5)), curve((66, 54), (10, 10))]
    # seed 0: wrong (4 + 6) / 2 = 5, right (-20 - 10) / 2 = -15; seed 1: wrong 7 (step 3 undefined
    # for Dr. GRPO), right (-25 - 25) / 2 = -25; seed 2: wrong 5, right -20.
    (row,) = exp.paired_rows({"grpo": grpo, "dr_grpo": dr})
    assert row["recipe"] == "grpo - dr_grpo"
    wrong, right = row["length_incorrect interval"], row["length_correct interval"]
    assert (wrong["mean"], right["mean"], wrong["n"]) == (pytest.approx(17 / 3), pytest.approx(-20.0), 3)
    half = 4.302653 * np.std([5, 7, 5], ddof=1) / np.sqrt(3)  # t_{0.975, 2} s / sqrt(n)
    assert (wrong["low"], wrong["high"]) == (pytest.approx(17 / 3 - half), pytest.approx(17 / 3 + half))


def test_length_neutral_rule_tells_no_effect_from_not_measured():
    """VERDICT_RULE on hand-made paired differences (tokens; max_tokens 96, so the margin is 4.8)."""
    exp = load_experiment("length_neutral")
    nan = float("nan")

    def decide(wrong, right=(-15.0, -25.0, -20.0, -10.0)):
        seeds = range(len(wrong))
        return exp.deciding_result({"length_incorrect": dict(zip(seeds, wrong)),
                                    "length_correct": dict(zip(seeds, right))},
                                   max_tokens=96, setting="hand-made", command="-", wall_s=0.0, seeds=list(seeds))

    got = decide((5.0, 7.0, 5.0, nan))  # seed 3 had no incorrect response: it does not count
    assert got.verdict == "reproduced" and got.seeds == (0, 1, 2) and got.excluded == {"3": "no incorrect response"}
    wrong = got.numbers["grpo - dr_grpo length_incorrect"]
    half = 4.302653 * np.std([5, 7, 5], ddof=1) / np.sqrt(3)  # t_{0.975, 2} s / sqrt(n)
    assert (wrong["mean"], wrong["low"], wrong["high"]) == pytest.approx((17 / 3, 17 / 3 - half, 17 / 3 + half))
    assert got.numbers["equivalence margin (tokens)"]["mean"] == pytest.approx(4.8)
    assert decide((5.0, 7.0, 5.0), right=(20.0, 25.0, 30.0)).verdict == "inconclusive"  # right ones grew too
    assert decide((-5.0, -7.0, -5.0)).verdict == "not reproduced"  # wrong ones shorter under GRPO
    assert decide((1.0, -1.0, 0.5, 0.0)).verdict == "not reproduced"  # inside +-4.8 tokens: no effect
    assert decide((1.0, -1.0, 9.0, 0.0)).verdict == "inconclusive"  # neither side, not inside the margin
    assert decide((5.0, 7.0, nan, nan)).verdict == "inconclusive"  # 2 counted seeds: not measured


@pytest.mark.slow  # ~30 s; make test-all
def test_chain_of_thought_configs_and_reduced_run(tiny_model_dir, tmp_path):
    exp = load_experiment("chain_of_thought")
    gpu = exp.get_config("grpo,gpu")
    assert (gpu.task.name, gpu.rollout.max_tokens, gpu.rollout.engine) == ("cot_gsm_symbolic", 2048, "vllm")
    task = make_task(gpu.task.name)
    example = task.examples("train", 1, seed=0)[0]
    assert example.prompt.endswith("Think step by step, then give your final answer as \\boxed{answer}.")
    assert task.reward_fn(f"... so \\boxed{{{example.answer}}}", example) == 1.0
    assert task.reward_fn("\\boxed{-1}", example) < 1.0
    from jaxrl_llm.train.config import ConfigError

    with pytest.raises(ConfigError, match="valid: one of"):
        exp.get_config("dapo")
    results = tmp_path / "result.json"
    assert exp.main(["--quick", "--out", str(tmp_path), "--results", str(results), f"model.source={tiny_model_dir}",
                     *TINY]) == 0
    rows = json.loads((tmp_path / "summary.json").read_text())["rows"]
    assert [r["recipe"] for r in rows] == ["grpo", "dr_grpo"] and rows[0]["reward last interval"]["n"] == 1
    stored = json.loads(results.read_text())  # one seed (--quick): below the rule's 3, so never decided
    assert stored["source"] == "run" and stored["verdict"] == "inconclusive" and stored["wall_s"] > 0
    assert stored["numbers"][exp.SIGNAL_KEY]["n"] == 1 and "load_average" in stored["machine"]
    info = read_run_info(tmp_path / "dr_grpo_s301")
    assert info["config"]["task"]["name"] == "cot_chain_sum"


def test_length_mechanism_keeps_finished_seeds_of_the_same_study_whatever_its_seed_count(tmp_path):
    """A seed's log depends on its own seed only: a run of 1 seed is kept by a later run of 3 seeds (with
    its wall time), a run of another study is refused."""
    import dataclasses

    exp = load_experiment("length_mechanism")
    from jaxrl_llm.reports.length_mechanism import MechanismStudy

    one = dataclasses.replace(MechanismStudy(), seeds=1)
    (tmp_path / "seeds").mkdir()
    (tmp_path / "seeds" / "120.json").write_text(json.dumps({"study": dataclasses.asdict(one), "logs": {"x": 1},
                                                             "wall_s": 12.5}))
    three = dataclasses.replace(one, seeds=3)
    assert exp.finished_seeds(tmp_path, three, [120, 121, 122]) == {120: {"logs": {"x": 1}, "wall_s": 12.5}}
    with pytest.raises(SystemExit, match="holds another study"):
        exp.finished_seeds(tmp_path, dataclasses.replace(three, steps=40), [120])
