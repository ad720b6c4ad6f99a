"""Reward shaping from the config: DARLING with the answer / lexical partitions and the
length rewards, checked against hand values, and a smoke run with both on."""
import numpy as np
import pytest

from jaxrl_llm.data import Example
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.run.metrics import read_metrics
from jaxrl_llm.train.sample.prompts import task_from_config
from jaxrl_llm.train.sample.shaping import TARGET_KEY, answer_partition, lexical_partition, shape_rewards, with_length_targets
from tests.train.tiny_run import tiny_config


def test_answer_partition_groups_equal_final_answers():
    texts = ["7", "The answer is 7.", "8", "no idea", "\\boxed{\\frac{1}{2}}", "\\boxed{0.5}", "also none"]
    assert answer_partition(texts) == [0, 0, 1, 2, 3, 3, 4]  # no answer: a class of its own


def test_lexical_partition_is_the_transitive_ngram_overlap():
    # bigrams: {the cat, cat sat} vs {the cat, cat sat, sat down}: Jaccard 2/3 >= 0.5
    assert lexical_partition(2, 0.5)(["the cat sat", "the cat sat down", "a dog ran"]) == [0, 0, 1]
    assert lexical_partition(2, 0.7)(["the cat sat", "the cat sat down", "a dog ran"]) == [0, 1, 2]


def _cfg(tiny_model_dir, tmp_path, *extra):
    return tiny_config(tiny_model_dir, tmp_path / "run", "rollout.samples_per_prompt=4", *extra)


def test_darling_multiplies_rewards_by_the_share_outside_the_class(tiny_model_dir, tmp_path):
    cfg = _cfg(tiny_model_dir, tmp_path, "shaping.darling=answer")
    task = task_from_config(cfg)
    texts = ["3", "3", "4", "5", "1", "2", "3", "x"]
    rewards = np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.float32)
    out = shape_rewards(cfg.shaping, task, rewards, texts, np.ones((2, 4)), [])
    # group 0: classes {3,3},{4},{5}: div = (4 - 2) / 3, 2/3, 1, 1; group 1: all distinct: div = 1
    np.testing.assert_allclose(out.rewards, [[2 / 3, 2 / 3, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]], rtol=1e-6)
    assert out.metrics["distinct_classes"] == pytest.approx((3 + 4) / 2)
    assert out.metrics["distinct_correct"] == pytest.approx((2 + 1) / 2)  # correct: {3, 4} and {1}
    assert out.metrics["unique_correct_share"] == pytest.approx((2 / 3 + 1 / 1) / 2)


def test_length_rewards_from_config_hand_values(tiny_model_dir, tmp_path):
    lengths = np.array([[2, 4, 6, 4]])
    rewards = np.array([[1, 1, 0, 0]], np.float32)
    texts = ["a"] * 4
    kimi = _cfg(tiny_model_dir, tmp_path, "shaping.length_reward=kimi", "shaping.length_reward_weight=0.2")
    out = shape_rewards(kimi.shaping, task_from_config(kimi), rewards, texts, lengths, [])
    # lambda = 0.5 - (len - 2) / 4 = 0.5, 0, -0.5, 0; wrong answers get min(0, lambda)
    np.testing.assert_allclose(out.rewards, [[1 + 0.1, 1.0, -0.1, 0.0]], rtol=1e-6, atol=1e-7)
    l1 = _cfg(tiny_model_dir, tmp_path, "shaping.length_reward=l1", "shaping.length_reward_weight=0.1",
              "shaping.l1_targets=[3]")
    example = with_length_targets(l1.shaping, [Example("q", "addition", "What is 1 + 1?", "2", "train")], seed=0)[0]
    assert example.prompt.endswith("\nThink for 3 tokens.") and example.metadata[TARGET_KEY] == 3
    out = shape_rewards(l1.shaping, task_from_config(l1), rewards, texts, lengths, [example])
    np.testing.assert_allclose(out.rewards, [[1 - 0.1, 1 - 0.1, -0.3, -0.1]], rtol=1e-6)
    assert out.metrics["l1_length_error"] == pytest.approx((1 + 1 + 3 + 1) / 4)


def test_impossible_shaping_configs_name_the_field(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="shaping.darling = 'answer'.*samples_per_prompt = 1"):
        tiny_config(tiny_model_dir, tmp_path, "shaping.darling=answer", "rollout.samples_per_prompt=1",
                    "train.micro_batch_size=1")
    with pytest.raises(ConfigError, match="shaping.l1_targets"):
        tiny_config(tiny_model_dir, tmp_path, "shaping.length_reward=l1", "shaping.l1_targets=[99]")
    with pytest.raises(ConfigError, match="recipe.overlong_buffer = 40 exceeds rollout.max_tokens = 6"):
        tiny_config(tiny_model_dir, tmp_path, "recipe.overlong_buffer=40")


@pytest.mark.slow  # 32 s, make test-all since 2026-11-29 (make test time); the hand values from config stay
def test_l1_and_darling_run_from_config(tiny_model_dir, tmp_path):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=2", "shaping.length_reward=l1",
                      "shaping.l1_targets=[2,4]", "shaping.darling=lexical", "shaping.darling_ngram=1")
    loop.train(cfg)
    rows = read_metrics(cfg.run_path)
    assert len(rows) == 2
    for row in rows:  # every completion hits max_tokens = 6: |6 - target| is 4 or 2
        assert 2.0 <= row["l1_length_error"] <= 4.0 and row["length_reward_mean"] < 0
        assert 1.0 <= row["distinct_classes"] <= 4.0
        assert row["reward_raw_mean"] == pytest.approx(row["reward"] + row["length_reward_mean"], abs=1e-5)
