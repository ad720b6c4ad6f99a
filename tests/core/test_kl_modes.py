"""KL to the reference as a loss term or as a per-token reward penalty, against numpy
computations of the same quantities by hand (k3 = e^x - 1 - x, x = log pi_ref - log pi)."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core

P, G, T = 2, 3, 4
BETA = 0.3


@pytest.fixture
def batch():
    rng = np.random.default_rng(0)
    rewards = rng.integers(0, 2, size=(P, G)).astype(np.float32)
    mask = np.ones((P * G, T), np.float32)
    mask[1, 2:] = 0
    mask[4, 1:] = 0
    old_logp = (-rng.uniform(0.1, 2.0, size=(P * G, T))).astype(np.float32)
    ref_logp = (-rng.uniform(0.1, 2.0, size=(P * G, T))).astype(np.float32)
    return rewards, mask, old_logp, ref_logp


def k3(logp, ref_logp, mask):
    x = ref_logp.astype(np.float64) - logp
    return (np.expm1(x) - x) * mask


def test_reward_mode_subtracts_the_summed_penalty_from_each_responses_reward(batch):
    rewards, mask, old_logp, ref_logp = batch
    recipe = core.get_recipe("dr_grpo", constant_length=T, kl_beta=BETA, kl_mode="reward")
    got, metrics = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, old_logp, ref_logp=ref_logp))
    shaped = rewards - BETA * k3(old_logp, ref_logp, mask).sum(axis=1).reshape(P, G)
    expected = (shaped - shaped.mean(axis=1, keepdims=True)).reshape(-1, 1) * mask  # Dr. GRPO: r - group mean
    np.testing.assert_allclose(np.asarray(got.advantages), expected, atol=1e-5)
    np.testing.assert_allclose(float(metrics["kl_reward_penalty_mean"]),
                               -BETA * k3(old_logp, ref_logp, mask).sum() / (P * G), rtol=1e-5)


def test_reward_mode_with_gae_places_the_penalty_on_each_token(batch):
    rewards, mask, old_logp, ref_logp = batch
    recipe = core.get_recipe("ppo", advantage_fn=core.GaeAdvantage(gamma=1.0, lam=1.0), kl_beta=BETA,
                             kl_mode="reward")
    values = np.zeros((P * G, T), np.float32)
    got, _ = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, old_logp, ref_logp=ref_logp, values=values))
    token_rewards = -BETA * k3(old_logp, ref_logp, mask)
    last = mask.sum(axis=1).astype(int) - 1
    token_rewards[np.arange(P * G), last] += rewards.reshape(-1)
    returns = np.cumsum(token_rewards[:, ::-1], axis=1)[:, ::-1] * mask  # gamma = lam = 1, V = 0
    np.testing.assert_allclose(np.asarray(got.advantages), returns, atol=1e-5)


def test_loss_mode_adds_beta_times_the_aggregated_kl_and_reward_mode_does_not(batch):
    rewards, mask, old_logp, ref_logp = batch
    logp = old_logp + 0.1
    losses = {}
    for mode in ("loss", "reward"):
        recipe = core.get_recipe("grpo", kl_beta=BETA, kl_mode=mode)
        step, _ = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, old_logp, ref_logp=ref_logp))
        loss, metrics = core.recipe_loss(recipe, jnp.asarray(logp), step)
        losses[mode] = (float(loss), float(metrics["policy_loss"]), metrics)
        # the logged KL is the token mean of k3 at the current policy, in both modes
        np.testing.assert_allclose(float(metrics["kl"]), k3(logp, ref_logp, mask).sum() / mask.sum(), rtol=1e-5)
    loss, policy, metrics = losses["loss"]
    weights = mask / mask.sum(axis=1, keepdims=True) / (P * G)  # seq-mean-token-mean
    np.testing.assert_allclose(loss - policy, BETA * (weights * k3(logp, ref_logp, mask)).sum(), rtol=1e-5)
    loss, policy, metrics = losses["reward"]
    assert loss == policy and "kl_loss" not in metrics


def test_bad_kl_mode_names_the_valid_ones():
    with pytest.raises(ValueError, match="kl_mode='both'; valid: loss, reward"):
        core.get_recipe("grpo", kl_mode="both")
