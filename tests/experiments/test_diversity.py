"""The diversity experiment (experiments/diversity.py) and its parts: the many-answers task
graded by hand, the verdict rule on hand intervals, and a reduced run (2 seeds x 2 variants
x 3 steps on the digit decoder) whose summary is recomputed from the runs' eval.jsonl."""
import json
import math

import numpy as np
import pytest

from jaxrl_llm.data import Example, make_task
from jaxrl_llm.data.many_answers import correct_answers, multiple_reward
from jaxrl_llm.reports.stats import Interval
from jaxrl_llm.train.run.evaluation import pass_at_k_curve
from tests.experiments.experiment_helpers import load_experiment, png_shape


def test_multiple_of_task_has_many_correct_answers_graded_by_hand():
    task = make_task("multiple_of")
    train = task.examples("train", 50, seed=0)
    heldout = task.examples("heldout", 10, seed=0, unique=True)
    assert {e.split for e in train} == {"train"} and not {e.id for e in train} & {e.id for e in heldout}
    example = Example("x", "multiple_of", "Name a multiple of 3 between 1 and 50.", "", "train", {"k": 3, "upper": 50})
    assert [multiple_reward(text, example) for text in ("12", " 48.", "51", "0", "7", "3 6", "", "-3")] == \
        [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert len(correct_answers(example)) == 16  # 3, 6, ..., 48
    assert min(len(correct_answers(e)) for e in train) >= 10  # k <= 5, M >= 50


def test_digit_model_answers_in_digits_and_can_emit_nothing_else(tmp_path):
    """The experiment's policy read back by transformers (an independent implementation):
    its vocabulary is the ten digits and EOS, the prompt keeps the question's numbers with
    each stretch of other text one EOS (counted by hand), and the next-token distribution is
    what the construction sets: digit logits 2.2 h.u, EOS 2.55 h.u with h.u ~ 5.6 (e^(0.35 h.u)
    = 7.2 = 0.42 / (0.58 / 10)), the ten digits equal."""
    import torch
    import transformers

    module = load_experiment("diversity")
    model_dir = module.digit_model(tmp_path / "model")
    tok = transformers.AutoTokenizer.from_pretrained(model_dir)
    assert sorted(tok.get_vocab()) == sorted([*"0123456789", "<|im_end|>"]) and tok.eos_token_id == module.EOS_ID
    question = "Name a multiple of 3 between 1 and 57. Answer with just the number."
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    ids = tok(text, add_special_tokens=False).input_ids
    eos = module.EOS_ID
    assert ids == [eos, tok.convert_tokens_to_ids("3"), eos, tok.convert_tokens_to_ids("1"), eos,
                   tok.convert_tokens_to_ids("5"), tok.convert_tokens_to_ids("7"), eos]
    assert tok.decode([tok.convert_tokens_to_ids(d) for d in "42"]) == "42"
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    with torch.no_grad():
        probs = model(torch.tensor([ids])).logits[0, -1].softmax(-1).numpy()
    assert probs.shape == (11,)
    digits = np.delete(probs, eos)
    assert digits.sum() == pytest.approx(0.58, abs=0.03) and probs[eos] == pytest.approx(0.42, abs=0.03)
    assert digits.max() - digits.min() < 1e-3


def test_verdict_reads_the_paired_intervals():
    verdict = load_experiment("diversity").verdict
    up, flat, down = Interval(0.1, 0.05, 0.15, 3), Interval(0.0, -0.05, 0.05, 3), Interval(-0.1, -0.15, -0.05, 3)
    assert verdict(flat, up) == "reproduced"  # pass@16 up, pass@1 not down
    assert verdict(down, up) == "not reproduced"  # pass@1 fell
    assert verdict(flat, down) == "not reproduced"
    assert verdict(flat, flat) == "inconclusive"
    assert verdict(flat, up, min_pairs=8) == "inconclusive"  # too few kept seeds
    assert verdict(Interval(0.0, math.nan, math.nan, 1), Interval(0.1, math.nan, math.nan, 1)).startswith("inconclusive")


@pytest.mark.slow  # 10 min 22 s at load ~19 (four tiny runs; the first compiles)
def test_diversity_reduced_two_seeds(tmp_path):
    module = load_experiment("diversity")
    out = tmp_path / "out"
    assert module.main(["--quick", "--seeds", "0,1", "--out", str(out), "--tuning", str(tmp_path / "tuning.json"),
                        "total_steps=3", "task.eval_every=3", "task.eval_size=4"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["variant"]: r for r in summary["rows"]}
    assert set(rows) == {"grpo", "darling", "darling - grpo (paired)"}
    for variant in ("grpo", "darling"):
        for seed in (0, 1):
            run = out / f"{variant}_s{seed}"
            evals = [json.loads(line) for line in (run / "eval.jsonl").read_text().splitlines()]
            assert [e["step"] for e in evals] == [3]
            correct = np.asarray(evals[-1]["correct"])
            assert correct.shape == (4, 16)
            curve = pass_at_k_curve(correct)  # recomputed from the saved correctness
            got = rows[variant]["per seed"][str(seed)]
            assert got["pass@1"] == pytest.approx(correct.mean(), abs=1e-6)
            assert got["pass@16"] == pytest.approx(curve[-1], abs=1e-6)
            distinct = evals[-1]["distinct_correct"]
            assert all(0 <= d <= c for d, c in zip(distinct, correct.sum(axis=1)))
            assert got["distinct correct / prompt"] == pytest.approx(np.mean(distinct))
        assert rows[variant]["pass@1 interval"]["n"] == 2
    diff = rows["darling - grpo (paired)"]
    want = np.mean([rows["darling"]["per seed"][s]["pass@16"] - rows["grpo"]["per seed"][s]["pass@16"]
                    for s in ("0", "1")])
    assert diff["pass@16 interval"]["mean"] == pytest.approx(want)
    assert diff["verdict"] in ("reproduced", "not reproduced") or diff["verdict"].startswith("inconclusive")
    assert "2 of the full size's 5 seeds" in (out / "summary.md").read_text()
    # the tuning record: a run diverged when its final held-out pass@16, recomputed here, is 0
    record = json.loads((tmp_path / "tuning.json").read_text())
    for variant in ("grpo", "darling"):
        final = {s: pass_at_k_curve(np.asarray([json.loads(line) for line in (out / f"{variant}_s{s}" / "eval.jsonl")
                                                 .read_text().splitlines()][-1]["correct"]))[-1] for s in (0, 1)}
        got = record["variants"][variant]
        assert got["diverged"] == sum(v == 0 for v in final.values()) and got["of"] == 2
        assert {s: r["pass@16"] for s, r in got["per_seed"].items()} == pytest.approx({str(s): v for s, v in
                                                                                      final.items()})
    assert record["seeds"] == [0, 1] and record["run_commits"] and record["machine"]["cores"] >= 1
    assert png_shape(out / "pass_at_k.png")[0] > 100 and png_shape(out / "seeds.png")[0] > 100


@pytest.mark.slow  # 2 min 16 s at load ~4: GRPO and DARLING, 200 steps each on the digits-and-EOS decoder
def test_darling_keeps_at_least_grpos_distinct_correct_answers(tmp_path):
    """Issue acceptance: DARLING's distinct correct answers per group at or above GRPO's on a
    task with many correct answers, same weights and seed (seed 1, the deciding run's settings:
    at the --quick size the digits-and-EOS decoder's two runs never repeat a correct answer, so
    they coincide exactly, 1.69 and 1.69). Measured here: held-out distinct correct answers per
    prompt (of 16 samples) 3.5 (DARLING) vs 1.0 (GRPO); training, last third: 2.28 vs 0.67.
    Held out, the test asks for strictly more: a DARLING that changed nothing would tie GRPO
    exactly (same seed, deterministic runs), so `>=` alone could not fail."""
    module = load_experiment("diversity")
    out = tmp_path / "out"
    assert module.main(["--seeds", "1", "--out", str(out), *module.DECIDING]) == 0
    per_seed = {r["variant"]: r["per seed"]["1"] for r in json.loads((out / "summary.json").read_text())["rows"]
                if "per seed" in r}
    grpo, darling = per_seed["grpo"], per_seed["darling"]
    print("grpo", grpo, "darling", darling)
    assert darling["distinct correct / prompt"] > grpo["distinct correct / prompt"]
    assert darling["train distinct correct / group (last third)"] >= grpo["train distinct correct / group (last third)"]
