"""Advantage estimators against hand-computed numbers and second formulations."""
import chex
import jax
import numpy as np
import pytest

from jaxrl_llm import core
from tests.core.batches import lengths_to_mask, random_batch

VARIANTS = dict(with_jit=True, without_jit=True)


class GroupAdvantagesTest(chex.TestCase):
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [0.0, 1.0, 2.0, 3.0]], np.float32)

    @chex.variants(**VARIANTS)
    def test_grpo_ddof1_matches_hand_values(self):
        out = self.variant(lambda r: core.grpo_advantages(r, ddof=1, eps=0.0))(self.rewards)
        # group 0: mean 1/2, std sqrt(1/3); group 1: mean 3/2, std sqrt(5/3)
        expected = np.array([[0.5, -0.5, -0.5, 0.5], [-1.5, -0.5, 0.5, 1.5]])
        expected /= np.array([[np.sqrt(1 / 3)], [np.sqrt(5 / 3)]])
        np.testing.assert_allclose(out, expected, rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_grpo_ddof0_and_eps(self):
        out = self.variant(lambda r: core.grpo_advantages(r, ddof=0, eps=0.5))(self.rewards[:1])
        # std (ddof 0) of [1, 0, 0, 1] is 1/2; 0.5 / (0.5 + 0.5) = 0.5
        np.testing.assert_allclose(out, [[0.5, -0.5, -0.5, 0.5]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_dr_grpo_is_centred_reward(self):
        out = self.variant(core.dr_grpo_advantages)(self.rewards)
        np.testing.assert_allclose(out, [[0.5, -0.5, -0.5, 0.5], [-1.5, -0.5, 0.5, 1.5]], atol=1e-7)

    @chex.variants(**VARIANTS)
    def test_rloo_matches_hand_values_and_leave_one_out_loop(self):
        out = self.variant(core.rloo_advantages)(self.rewards)
        # r_0 = 1, others (0, 0, 1): 1 - 1/3 = 2/3
        np.testing.assert_allclose(out[0], [2 / 3, -2 / 3, -2 / 3, 2 / 3], rtol=1e-6)
        loop = [[r[i] - np.mean(np.delete(r, i)) for i in range(len(r))] for r in self.rewards]
        np.testing.assert_allclose(out, loop, rtol=1e-6, atol=1e-7)

    @chex.variants(**VARIANTS)
    def test_batch_std(self):
        rewards = np.array([[1.0, 0.0], [0.0, 0.0]], np.float32)
        out = self.variant(lambda r: core.batch_std_advantages(r, ddof=1, eps=0.0))(rewards)
        # centred [[.5, -.5], [0, 0]]; std (ddof 1) of [1, 0, 0, 0] = 1/2
        np.testing.assert_allclose(out, [[1.0, -1.0], [0.0, 0.0]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_group_size_one_gives_zero(self):
        rewards = np.array([[3.0], [-1.0]], np.float32)
        for fn in (core.grpo_advantages, core.dr_grpo_advantages, core.rloo_advantages,
                   core.batch_std_advantages):
            out = self.variant(fn)(rewards)
            np.testing.assert_array_equal(out, np.zeros((2, 1)))
        mask = np.ones((2, 3), np.float32)
        out = self.variant(core.reinforce_pp_advantages)(rewards, mask)
        np.testing.assert_array_equal(out, np.zeros((2, 3)))

    @chex.variants(**VARIANTS)
    def test_all_equal_rewards_give_exact_zero_without_nan(self):
        # 0.1 is not exact in binary: a float mean can differ from the values by an ulp.
        rewards = np.full((2, 7), 0.1, np.float32)
        for fn in (lambda r: core.grpo_advantages(r, eps=0.0), core.dr_grpo_advantages,
                   core.rloo_advantages, lambda r: core.batch_std_advantages(r, eps=0.0)):
            out = self.variant(fn)(rewards)
            np.testing.assert_array_equal(out, np.zeros((2, 7)))

    @chex.variants(**VARIANTS)
    def test_reinforce_pp_token_whitening(self):
        rewards = np.array([[1.0, 0.0]], np.float32)
        mask = lengths_to_mask([2, 1], 3)
        out = self.variant(lambda r, m: core.reinforce_pp_advantages(r, m, ddof=1, eps=0.0))(rewards, mask)
        # tokens (.5, .5, -.5): mean 1/6, deviations (1/3, 1/3, -2/3), var (ddof 1) = 1/3
        s = np.sqrt(1 / 3)
        np.testing.assert_allclose(out, [[1 / 3 / s, 1 / 3 / s, 0.0], [-2 / 3 / s, 0.0, 0.0]], rtol=1e-6)

    @chex.variants(**VARIANTS)
    def test_broadcast_to_tokens(self):
        adv = np.array([[1.0, -2.0]], np.float32)
        mask = lengths_to_mask([1, 3], 3)
        out = self.variant(core.broadcast_to_tokens)(adv, mask)
        np.testing.assert_array_equal(out, [[1.0, 0.0, 0.0], [-2.0, -2.0, -2.0]])


def test_shift_and_scale_invariance_of_grpo():
    rewards = random_batch(0, binary_rewards=False).rewards
    base = core.grpo_advantages(rewards, eps=0.0)
    np.testing.assert_allclose(core.grpo_advantages(3.0 * rewards + 7.0, eps=0.0), base, atol=2e-5)


def test_nan_reward_error_names_index():
    rewards = np.zeros((3, 4), np.float32)
    rewards[1, 2] = np.nan
    rewards[2, 0] = np.inf
    for fn in (core.validate_rewards, core.grpo_advantages, core.dr_grpo_advantages,
               core.rloo_advantages, core.batch_std_advantages):
        with pytest.raises(ValueError, match=r"rewards\[1, 2\] = nan"):
            fn(rewards)
    with pytest.raises(ValueError, match=r"rewards\[0, 1\] = inf"):
        core.validate_rewards(np.array([[0.0, np.inf]]))
    with pytest.raises(ValueError, match=r"rank 2"):
        core.validate_rewards(np.zeros(3))


def test_nan_reward_under_jit_stays_in_its_group():
    """Documented jit behaviour: no host check, the NaN only poisons its own group."""
    rewards = np.array([[1.0, 0.0], [1.0, np.nan]], np.float32)
    out = np.asarray(jax.jit(core.grpo_advantages)(rewards))
    assert np.all(np.isfinite(out[0])) and np.all(np.isnan(out[1]))


def test_bad_ddof_and_shapes():
    with pytest.raises(ValueError, match="ddof"):
        core.grpo_advantages(np.zeros((2, 3)), ddof=3)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(5, 4\)"):
        core.broadcast_to_tokens(np.zeros((2, 3)), np.ones((5, 4)))


class GaeTest(chex.TestCase):
    @chex.variants(**VARIANTS)
    def test_hand_computed(self):
        rewards = np.array([[0.0, 0.0, 1.0]], np.float32)
        values = np.array([[0.5, 0.6, 0.7]], np.float32)
        out = self.variant(lambda r, v, m: core.gae_advantages(r, v, m, gamma=0.9, lam=0.8))(
            rewards, values, np.ones((1, 3)))
        # deltas: 0.04, 0.03, 0.3; A2 = .3, A1 = .03 + .72 * .3, A0 = .04 + .72 * A1
        a1 = 0.03 + 0.72 * 0.3
        expected = np.array([[0.04 + 0.72 * a1, a1, 0.3]])
        np.testing.assert_allclose(out.advantages, expected, rtol=1e-5)
        np.testing.assert_allclose(out.returns, expected + values, rtol=1e-5)

    @chex.variants(**VARIANTS)
    def test_matches_explicit_sum_and_ignores_nan_padding(self):
        batch = random_batch(1, width=7)
        gamma, lam = 0.95, 0.7
        rewards = core.terminal_token_rewards(batch.rewards, batch.mask)
        values = np.where(batch.mask != 0, batch.values, np.nan).astype(np.float32)
        out = self.variant(lambda r, v, m: core.gae_advantages(r, v, m, gamma=gamma, lam=lam))(
            rewards, values, batch.mask)
        expected = np.zeros_like(batch.values, dtype=np.float64)
        for i, length in enumerate(batch.mask.sum(1).astype(int)):
            v = np.append(batch.values[i, :length].astype(np.float64), 0.0)
            delta = np.asarray(rewards)[i, :length] + gamma * v[1:] - v[:-1]
            for t in range(length):
                expected[i, t] = sum((gamma * lam) ** l * delta[t + l] for l in range(length - t))
        np.testing.assert_allclose(out.advantages, expected, atol=1e-5)
        assert np.all(np.isfinite(out.returns))

    @chex.variants(**VARIANTS)
    def test_terminal_token_rewards(self):
        out = self.variant(core.terminal_token_rewards)(np.array([[2.0, 3.0, 4.0]]), lengths_to_mask([2, 0, 3], 4))
        np.testing.assert_array_equal(out, [[0, 2, 0, 0], [0, 0, 0, 0], [0, 0, 4, 0]])

    def test_rejects_bad_gamma(self):
        with pytest.raises(ValueError, match="gamma"):
            core.gae_advantages(np.zeros((1, 2)), np.zeros((1, 2)), np.ones((1, 2)), gamma=1.5, lam=1.0)
