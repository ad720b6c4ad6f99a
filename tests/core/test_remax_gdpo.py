"""ReMax and GDPO advantages: hand values, an independent numpy formulation on random inputs, and
how prepare_step_batch hands each its extra input (and refuses it elsewhere)."""
import numpy as np
import pytest

from jaxrl_llm import core


def test_remax_hand_values():
    # prompt 0: greedy scored 1 -> samples 1, 0, 1 get 0, -1, 0; prompt 1: greedy 0 -> 0, 0.5, 1
    got = core.remax_advantages(np.array([[1, 0, 1], [0, 0.5, 1]], np.float32), np.array([1, 0], np.float32))
    np.testing.assert_array_equal(got, [[0, -1, 0], [0, 0.5, 1]])


def test_remax_equals_a_numpy_loop_on_random_inputs():
    rng = np.random.default_rng(0)
    rewards, baseline = rng.normal(size=(7, 5)).astype(np.float32), rng.normal(size=7).astype(np.float32)
    want = np.array([[rewards[p, g] - baseline[p] for g in range(5)] for p in range(7)])
    np.testing.assert_allclose(core.remax_advantages(rewards, baseline), want, atol=1e-6)


def test_remax_refuses_a_baseline_of_the_wrong_length_and_nan():
    with pytest.raises(ValueError, match=r"baseline_rewards has 3 entries for 2 prompts"):
        core.remax_advantages(np.zeros((2, 4)), np.zeros(3))
    with pytest.raises(ValueError, match="not finite"):
        core.remax_advantages(np.zeros((2, 4)), np.array([0.0, np.nan]))


def test_gdpo_hand_values():
    # Two rewards, weights 1 and 0.5, groups of 3 (GRPO std, ddof 1: the normalised values of a
    # 2-vs-1 group are +-1/sqrt(3) and -+2/sqrt(3)).
    # prompt 0: r1 = [1,0,1] -> [1,-2,1]/sqrt3; r2 = [0,1,1] -> [-2,1,1]/sqrt3, x0.5 -> [-1,.5,.5]/sqrt3
    #   sum [0, -1.5, 1.5]/sqrt3
    # prompt 1: r1 constant -> 0; r2 = [0,1,0] -> [-1,2,-1]/sqrt3 x0.5 = [-.5, 1, -.5]/sqrt3
    # batch: mean 0, population std of [0,-1.5,1.5,-.5,1,-.5]/sqrt3 = sqrt(5/6 / 3 ... ) = 1/sqrt3
    parts = np.array([[[1, 0], [0, 1], [1, 1]], [[0, 0], [0, 1], [0, 0]]], np.float32)
    got = core.gdpo_advantages(parts, (1.0, 0.5))
    np.testing.assert_allclose(got, [[0, -1.5, 1.5], [-0.5, 1, -0.5]], atol=1e-5)


def numpy_gdpo(parts: np.ndarray, weights, eps: float = 1e-6) -> np.ndarray:
    """The GDPO advantage written out with float64 numpy loops."""
    total = np.zeros(parts.shape[:2])
    for k, w in enumerate(weights):
        for p in range(parts.shape[0]):
            r = parts[p, :, k].astype(np.float64)
            if np.all(r == r[0]):
                continue
            total[p] += w * (r - r.mean()) / (r.std(ddof=1) + eps)
    if not total.any():
        return total
    return (total - total.mean()) / (total.std() + eps)


@pytest.mark.parametrize("seed, k", [(0, 1), (1, 2), (2, 3)])
def test_gdpo_equals_a_numpy_formulation_on_random_inputs(seed, k):
    rng = np.random.default_rng(seed)
    parts = np.concatenate([(rng.random((9, 6, 1)) < 0.5), rng.normal(size=(9, 6, k - 1))], axis=2).astype(np.float32)
    parts[0] = 1.0  # a group in which every reward is constant
    weights = tuple(rng.uniform(0.1, 2.0, size=k))
    np.testing.assert_allclose(core.gdpo_advantages(parts, weights), numpy_gdpo(parts, weights), atol=2e-5)


def test_gdpo_keeps_reward_combinations_apart_that_grpo_on_the_sum_merges():
    # The paper's point (arXiv 2601.05242, fig. 2): two 0/1 rewards, groups of 2. GRPO on the sum
    # gives the winner the same advantage whether it won on one reward or on both; the summed
    # per-reward normalised values (before the batch step) are twice as large for both.
    one = np.array([[[1, 0], [0, 0]]], np.float32)  # wins on reward 1 only
    both = np.array([[[1, 1], [0, 0]]], np.float32)  # wins on both
    grpo = [core.grpo_advantages(x.sum(axis=2))[0, 0] for x in (one, both)]
    np.testing.assert_allclose(grpo[0], grpo[1], rtol=1e-5)
    gdpo_sum = [float(sum(core.grpo_advantages(x[:, :, k])[0, 0] for k in range(2))) for x in (one, both)]
    assert gdpo_sum[1] == pytest.approx(2 * gdpo_sum[0], rel=1e-5)


def test_one_reward_with_weight_one_is_grpo_whitened_over_the_batch():
    rng = np.random.default_rng(3)
    rewards = (rng.random((5, 4)) < 0.5).astype(np.float32)
    grpo = np.asarray(core.grpo_advantages(rewards), np.float64)
    want = (grpo - grpo.mean()) / (grpo.std() + 1e-6) if grpo.any() else grpo
    np.testing.assert_allclose(core.gdpo_advantages(rewards[:, :, None], (1.0,)), want, atol=1e-5)


def test_gdpo_refuses_a_weight_count_that_does_not_match():
    with pytest.raises(ValueError, match="2 weights for 3 rewards"):
        core.gdpo_advantages(np.zeros((2, 4, 3)), (1.0, 1.0))


def test_prepare_step_batch_hands_each_estimator_its_input_and_refuses_it_elsewhere():
    rewards = np.array([[1.0, 0.0]], np.float32)
    mask = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
    logp = np.zeros((2, 3), np.float32)
    baseline = {"baseline_rewards": np.array([1.0], np.float32)}
    batch, _ = core.prepare_step_batch(core.get_recipe("remax"), core.StepInputs(rewards, mask, logp, extras=baseline))
    np.testing.assert_array_equal(np.asarray(batch.advantages), [[0, 0, 0], [-1, 0, 0]])
    parts = np.array([[[1, 0], [0, 1]]], np.float32)  # the two rewards cancel: advantage 0
    recipe = core.get_recipe("gdpo", advantage_fn=core.MultiRewardAdvantage(weights=(1.0, 1.0)))
    batch, _ = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, logp, extras={"reward_parts": parts}))
    np.testing.assert_allclose(np.asarray(batch.advantages), 0.0, atol=1e-6)
    one_part = core.StepInputs(rewards, mask, logp, extras={"reward_parts": parts[:, :, :1]})
    batch, _ = core.prepare_step_batch(core.get_recipe("gdpo"), one_part)
    np.testing.assert_allclose(np.asarray(batch.advantages), [[1, 1, 0], [-1, 0, 0]], atol=1e-5)
    with pytest.raises(ValueError, match=r"extras \['baseline_rewards'\] given, but recipe 'grpo'"):
        core.prepare_step_batch(core.get_recipe("grpo"), core.StepInputs(rewards, mask, logp,
                                                                         extras={"baseline_rewards": np.ones(1)}))
    with pytest.raises(ValueError, match="greedy response per prompt"):
        core.prepare_step_batch(core.get_recipe("remax"), core.StepInputs(rewards, mask, logp))
    with pytest.raises(ValueError, match=r"extras\['reward_parts'\] \[P, G, K\]"):
        core.prepare_step_batch(core.get_recipe("gdpo"), core.StepInputs(rewards, mask, logp))
