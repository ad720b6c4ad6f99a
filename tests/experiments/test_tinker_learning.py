"""Experiment 14 (experiments/tinker_learning.py, issue 63 deliverable 5) end to end at a reduced size: a random
tiny decoder with SmolLM2's tokenizer, 2 steps, 8 held-out sums, 3 seeds, both arms (the unmodified cookbook
recipe through serve-tinker, and jaxrl train on the task cookbook_arithmetic). The tiny decoder never ends a
reply within 5 tokens, so every reward is the cookbook's format penalty, -0.1, before and after training: every
gain is exactly 0, so the "up" part is not reproduced (its interval sits inside +-0.05) and the equivalence part
is (inside +-0.1). The task is checked against the cookbook's own dataset and environment objects.
"""
import json
import math

import numpy as np
import pytest

from tests.experiments.experiment_helpers import load_experiment

SEEDS = (1, 2, 3)


def t_interval(values):
    from scipy import stats

    x = np.asarray(values, float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return x.mean(), x.mean() - half, x.mean() + half


def test_cookbook_arithmetic_task_gives_the_cookbooks_questions_prompts_and_rewards(tiny_model_dir, tmp_path):
    import asyncio

    from tinker_cookbook import renderers
    from tinker_cookbook.recipes.math_rl.arithmetic_env import ArithmeticDataset
    from tinker_cookbook.tokenizer_utils import get_tokenizer
    from tokenizers import Tokenizer

    from jaxrl_llm.train.policy import load_policy
    from jaxrl_llm.train.sample.prompts import step_examples

    exp = load_experiment("tinker_learning")  # imports experiments/cookbook_arithmetic.py as the task plug-in does
    task = exp.CookbookArithmetic(exp.pass_through_model(tiny_model_dir, tmp_path / "pass"))
    policy = load_policy(task.model_dir)
    renderer = renderers.get_renderer("qwen3_instruct", tokenizer=get_tokenizer(tiny_model_dir))
    dataset = ArithmeticDataset(batch_size=8, renderer=renderer, group_size=4)
    for step in (1, 2, 7):  # jaxrl train's step t is the cookbook's batch t - 1, whatever the run's seed
        examples = step_examples(task, step, seed=663, prompts=8)
        envs = [builder.env_thunk() for builder in dataset.get_batch(step - 1)]
        assert [(e.metadata["x"], e.metadata["y"]) for e in examples] == [(env.x, env.y) for env in envs]
        for example, env in zip(examples, envs):
            tokens, _ = asyncio.run(env.initial_observation())
            assert policy.tokenizer.encode(policy.chat.render_prompt(example.prompt),
                                           add_special_tokens=False).ids == tokens.to_ints()
    tok = Tokenizer.from_file(f"{tiny_model_dir}/tokenizer.json")
    env = dataset.get_batch(0)[0].env_thunk()
    example = step_examples(task, 1, seed=0, prompts=8)[0]
    right, wrong, filler = (tok.encode(t, add_special_tokens=False).ids for t in
                            (str(env.x + env.y), str(env.x + env.y + 1), " a a a a a"))
    # stopped: the answer then <|im_end|> (id 2, the renderer's stop); cut: 5 tokens (max_tokens), no stop
    cases = {"right, stopped": right + [2], "wrong, stopped": wrong + [2], "right, cut": (filler + right)[-5:],
             "wrong, cut": (filler + wrong)[-5:], "no answer, cut": filler[:5]}
    rewards = {}
    for name, ids in cases.items():
        rewards[name] = asyncio.run(env.step(ids)).reward  # the cookbook's own reward
        text = tok.decode([t for t in ids if t != 2])  # what jaxrl train grades: the reply, EOS removed
        assert task.reward_fn(text, example) == pytest.approx(rewards[name]), name
    assert rewards == pytest.approx({"right, stopped": 1.0, "wrong, stopped": 0.0, "right, cut": 0.9,
                                     "wrong, cut": -0.1, "no answer, cut": -0.1})


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_tinker_learning_reduced_run_stores_the_rules_numbers(tiny_model_dir, tmp_path):
    exp = load_experiment("tinker_learning")
    result_path = tmp_path / "result.json"
    assert exp.main(["--model", tiny_model_dir, "--seeds", ",".join(map(str, SEEDS)), "--steps", "2",
                     "--heldout", "8", "--out", str(tmp_path / "out"), "--results", str(result_path)]) == 0
    result = json.loads(result_path.read_text())
    for seed in SEEDS:
        metrics = [json.loads(line) for line in (tmp_path / "out" / f"server_s{seed}" / "cookbook" /
                                                 "metrics.jsonl").read_text().splitlines()]
        steps = [m for m in metrics if "env/all/reward/total" in m]
        assert [m["step"] for m in steps] == [0, 1]
        assert all(m["env/all/reward/total"] == pytest.approx(-0.1) for m in steps)  # never stops in 5 tokens
        jaxrl = [json.loads(line) for line in (tmp_path / "out" / f"jaxrl_s{seed}" / "metrics.jsonl")
                 .read_text().splitlines()]
        assert [m["step"] for m in jaxrl] == [1, 2] and all(m["reward"] == pytest.approx(-0.1) for m in jaxrl)
        for key in (exp.GAIN, exp.JAXRL_GAIN, exp.DIFFERENCE):
            assert result["per_seed"][key][str(seed)] == pytest.approx(0.0, abs=1e-9)
    for key, per_seed in result["per_seed"].items():
        stored = result["numbers"][key]
        assert (stored["mean"], stored["low"], stored["high"]) == pytest.approx(t_interval(list(per_seed.values())),
                                                                                nan_ok=True)
    assert result["verdict"] == exp.rule_verdict(result["numbers"]) == "not reproduced"
    assert result["seeds"] == list(SEEDS) and result["verdict_rule"] == exp.VERDICT_RULE


def test_the_equivalence_reading_by_hand():
    from jaxrl_llm.reports.stats import Interval

    exp = load_experiment("tinker_learning")
    assert exp.equivalence_reading(Interval(0.01, -0.05, 0.09, 3)) == "reproduced"
    assert exp.equivalence_reading(Interval(0.2, 0.1, 0.3, 3)) == "not reproduced"
    assert exp.equivalence_reading(Interval(-0.2, -0.3, -0.1, 3)) == "not reproduced"
    assert exp.equivalence_reading(Interval(0.05, -0.02, 0.12, 3)) == "inconclusive"
    assert exp.equivalence_reading(Interval(0.0, -0.01, 0.01, 2)) == "inconclusive"  # < 3 seeds


def test_stored_result_follows_its_rule():
    """experiments/results/tinker_learning.json, the deciding run's: >= 3 seeds none of them a tuning seed, every
    interval recomputed from its per-seed numbers, the difference = the two gains' difference per seed, the
    verdict the file's rule gives."""
    from jaxrl_llm.reports.results import RESULTS_DIR

    exp = load_experiment("tinker_learning")
    result = json.loads((RESULTS_DIR / "tinker_learning.json").read_text())
    assert len(result["seeds"]) >= 3 and not set(result["seeds"]) & set(result["tuning_seeds"])
    for key, per_seed in result["per_seed"].items():
        stored = result["numbers"][key]
        assert (stored["mean"], stored["low"], stored["high"]) == pytest.approx(t_interval(list(per_seed.values())))
    for seed in map(str, result["seeds"]):
        gains = result["per_seed"][exp.GAIN][seed] - result["per_seed"][exp.JAXRL_GAIN][seed]
        assert result["per_seed"][exp.DIFFERENCE][seed] == pytest.approx(gains)
    assert result["verdict"] == exp.rule_verdict(result["numbers"]) and result["verdict_rule"] == exp.VERDICT_RULE
