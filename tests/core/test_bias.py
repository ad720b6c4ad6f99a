"""Bias diagnostics against hand values and against the advantage functions."""
import chex
import numpy as np
import pytest

from jaxrl_llm import core

VARIANTS = dict(with_jit=True, without_jit=True)


class BiasTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_difficulty_weight_hand_values(self):
        p = np.array([0.0, 0.25, 0.5, 1.0], np.float32)
        plain = self.variant(lambda q: core.difficulty_weight(q, std_normalised=False))(p)
        std = self.variant(lambda q: core.difficulty_weight(q, std_normalised=True))(p)
        np.testing.assert_allclose(plain, [0.0, 0.375, 0.5, 0.0], rtol=1e-6)
        np.testing.assert_allclose(std, [0.0, 2 * np.sqrt(3 / 16), 1.0, 0.0], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_implied_sequence_weight_shows_length_bias(self):
        lengths = np.array([2.0, 4.0, 8.0], np.float32)
        adv = np.ones(3, np.float32)
        per_sequence = {
            mode: self.variant(lambda l, a, mode=mode: core.implied_sequence_weight(
                l, a, mode, num_responses=3, constant_length=16))(lengths, adv)
            for mode in core.AGGREGATION_MODES
        }
        np.testing.assert_allclose(per_sequence["seq_mean_token_mean"], [1 / 3] * 3, rtol=1e-6)
        np.testing.assert_allclose(per_sequence["token_mean"], lengths / 14, rtol=1e-6)
        np.testing.assert_allclose(per_sequence["seq_mean_token_sum"], lengths / 3, rtol=1e-6)
        np.testing.assert_allclose(per_sequence["constant"], lengths / 48, rtol=1e-6)


@pytest.mark.parametrize("successes", [1, 2, 4, 6, 7])
def test_difficulty_weight_equals_mean_abs_advantage(successes):
    """Second formulation: E|A| over a binary group with success rate p = successes / 8."""
    rewards = np.zeros((1, 8), np.float32)
    rewards[0, :successes] = 1.0
    p = successes / 8
    no_std = float(np.mean(np.abs(core.dr_grpo_advantages(rewards))))
    with_std = float(np.mean(np.abs(core.grpo_advantages(rewards, ddof=0, eps=0.0))))
    np.testing.assert_allclose(core.difficulty_weight(p, std_normalised=False), no_std, rtol=1e-6)
    np.testing.assert_allclose(core.difficulty_weight(p, std_normalised=True), with_std, rtol=1e-6)


def test_implied_token_weight_errors():
    with pytest.raises(ValueError, match="valid modes"):
        core.implied_token_weight(np.ones(2), np.ones(2), "mean", num_responses=2)
    with pytest.raises(ValueError, match="constant_length"):
        core.implied_token_weight(np.ones(2), np.ones(2), "constant", num_responses=2)
    with pytest.raises(ValueError, match=r"\(2,\).*\(3,\)"):
        core.implied_token_weight(np.ones(2), np.ones(3), "token_mean", num_responses=2)
