"""DAPO dynamic sampling: the choice of groups on accuracy (hand cases) and, in a real
run with the dapo recipe, a full step batch in which no group of all-right or all-wrong
answers reaches the learner, although the overlong penalty gives the all-right groups
shaped rewards that differ."""
import numpy as np
import pytest

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.config import ConfigError
from jaxrl_llm.train.config.recipe import recipe_from_config
from jaxrl_llm.train.sample.dynamic_sampling import SampledRound, informative_groups, round_seed, sample_until_full
from jaxrl_llm.train.run.metrics import read_groups, read_metrics
from jaxrl_llm.train.sample.prompts import task_from_config
from tests.train.tiny_run import tiny_config


def test_informative_groups_are_those_with_accuracy_strictly_between_0_and_1():
    correct = np.array([[1, 1, 1], [0, 0, 0], [1, 0, 0], [0, 1, 1]], bool)
    np.testing.assert_array_equal(informative_groups(correct), [False, False, True, True])


def _round(rewards: np.ndarray, tag: int) -> SampledRound:
    """A round of P x G records whose completion length encodes (tag, prompt, sample)."""
    prompts, group = rewards.shape
    records = [RolloutRecord(p, g, np.array([1]), np.arange(tag * 100 + p * 10 + g + 1),
                             np.zeros(tag * 100 + p * 10 + g + 1), "stop", 0)
               for p in range(prompts) for g in range(group)]
    return SampledRound(RolloutBatch(records, prompts, group), rewards.astype(np.float32))


def test_rounds_are_drawn_until_full_and_groups_are_chosen_on_accuracy_in_order():
    # shaped rewards: an all-correct group whose rewards differ (1.0 vs 0.9) must still be dropped
    rounds = [np.array([[1.0, 0.9], [0.0, 1.0], [0.0, 0.0]]), np.array([[1.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
              np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])]
    calls = []

    def sample(r):
        calls.append(r)
        return _round(rounds[r], r)

    filled, drawn = sample_until_full(sample, lambda rw: rw >= 0.9, max_rounds=5)
    assert calls == [0, 1] and len(drawn) == 2  # round 0 keeps 1 group, round 1 two more: full
    assert filled.source == ((0, 1), (1, 1), (1, 2))
    np.testing.assert_array_equal(filled.rewards, [[0.0, 1.0], [1.0, 0.0], [0.0, 1.0]])
    assert [r.prompt_index for r in filled.rollouts.records] == [0, 0, 1, 1, 2, 2]
    assert [r.num_completion_tokens for r in filled.rollouts.records] == [11, 12, 111, 112, 121, 122]
    assert filled.metrics == {"dynamic_sampling_rounds": 2.0, "dynamic_sampling_extra_tokens": 111 + 112 + 121 + 122
                              + 101 + 102, "dynamic_sampling_kept_fraction": 3 / 6, "dynamic_sampling_unfilled": 0.0}


def test_the_round_bound_fills_the_rest_with_the_earliest_dropped_groups():
    rounds = [np.array([[1.0, 1.0], [0.0, 1.0]]), np.array([[0.0, 0.0], [1.0, 1.0]])]
    filled, drawn = sample_until_full(lambda r: _round(rounds[r], r), lambda rw: rw >= 1.0, max_rounds=2)
    assert len(drawn) == 2 and filled.source == ((0, 1), (0, 0))
    assert filled.metrics["dynamic_sampling_unfilled"] == 1.0 and filled.metrics["dynamic_sampling_kept_fraction"] == 0.25


def test_round_seeds_keep_round_0_and_differ_per_round():
    assert round_seed(7, 0) == 7
    seeds = {round_seed(s, r) for s in range(5) for r in range(1, 4)}
    assert len(seeds) == 15 and round_seed(3, 2) == round_seed(3, 2)


def test_dynamic_sampling_with_groups_of_one_is_refused(tiny_model_dir, tmp_path):
    with pytest.raises(ConfigError, match="rollout.dynamic_sampling.*samples_per_prompt = 1"):
        tiny_config(tiny_model_dir, tmp_path, "recipe.name=dapo", "rollout.samples_per_prompt=1",
                    "train.micro_batch_size=1")


def even_sums_always_right(completion: str, example) -> float:
    """Groups of prompts with an even sum are all right; the others right on odd-length text."""
    return 1.0 if int(example.answer) % 2 == 0 else float(len(completion) % 2)


@pytest.mark.parametrize("max_lag", [0, pytest.param(1, marks=pytest.mark.slow)], ids=["sync", "async"])  # async: 11 s, make test-all since 2026-11-29 (make test time)
def test_dapo_run_feeds_only_mixed_accuracy_groups_and_fills_the_batch(tiny_model_dir, tmp_path, monkeypatch, max_lag):
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "recipe.name=dapo", "total_steps=3",
                      "rollout.prompts_per_step=4", "rollout.dynamic_sampling_rounds=6", f"rollout.max_lag={max_lag}")
    recipe = recipe_from_config(cfg)
    assert recipe.overlong.max_length == 6 and recipe.overlong.buffer == 1  # 20% of max_tokens, as in the paper
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(even_sums_always_right))
    out = loop.train(cfg, task=task)
    assert out.ledger["consumed"] == 3 * 4 * 4  # every step handed the learner a full batch
    groups, rows = read_groups(cfg.run_path), read_metrics(cfg.run_path)
    for g, row in zip(groups, rows):
        accuracy = (np.asarray(g["rewards"]) >= 1.0).mean(axis=1)
        assert len(accuracy) == 4 and np.all((accuracy > 0) & (accuracy < 1)), g  # full, none uninformative
        assert row["dynamic_sampling_unfilled"] == 0.0
        assert row["zero_variance_group_fraction"] == 0.0  # the learner's own filter finds nothing to drop
    assert sum(row["dynamic_sampling_rounds"] for row in rows) > len(rows)  # groups were dropped and resampled
    assert min(row["dynamic_sampling_kept_fraction"] for row in rows) < 1.0
    assert all(row["dynamic_sampling_extra_tokens"] > 0 for row in rows if row["dynamic_sampling_rounds"] > 1)


def even_sums_right_with_a_length_bonus(completion: str, example) -> float:
    """Right (>= 1) on even sums, with a bonus that differs between samples; wrong (0) otherwise."""
    return 1.0 + 0.5 * (len(completion) % 2) if int(example.answer) % 2 == 0 else 0.0


def test_without_dynamic_sampling_the_learner_filter_drops_groups_by_accuracy(tiny_model_dir, tmp_path, monkeypatch):
    """Dynamic sampling off: the learner's own zero-variance filter still judges accuracy. The
    all-right groups (even sums) have graders' rewards that differ (1 or 1.5), yet the fraction
    dropped equals the fraction of groups whose accuracy is 0 or 1."""
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "recipe.name=dapo", "total_steps=2",
                      "rollout.prompts_per_step=4", "rollout.dynamic_sampling=false")
    task = task_from_config(cfg)
    monkeypatch.setattr(type(task), "reward_fn", staticmethod(even_sums_right_with_a_length_bonus))
    loop.train(cfg, task=task)
    groups, rows = read_groups(cfg.run_path), read_metrics(cfg.run_path)
    assert len(rows) == 2
    all_right_differing = 0
    for g, row in zip(groups, rows):
        rewards = np.asarray(g["rewards"])
        accuracy = (rewards >= 1.0).mean(axis=1)
        assert row["zero_variance_group_fraction"] == pytest.approx(np.mean((accuracy == 0) | (accuracy == 1)))
        all_right_differing += int(np.sum((accuracy == 1) & (rewards.min(axis=1) < rewards.max(axis=1))))
    assert all_right_differing > 0  # the case arose: rewards differed inside an all-right group
