"""OPO and pass@k advantages, the SAPO loss: hand values, an independent numpy formulation on
random inputs (pass@k: brute-force enumeration of the subsets), gradients by finite differences."""
import itertools
import math

import jax
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides


def test_pass_at_k_hand_values():
    # [1,0,0,0], k=2: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2; correct (1 - 1/2)/(1/2) = 1;
    # wrong: the subsets with it hold another wrong one with chance C(2,1)/C(3,1) = 2/3 -> (1/2 - 2/3)/(1/2)
    got = core.pass_at_k_advantages(np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], np.float32), k=2)
    np.testing.assert_allclose(got, [[1, -1 / 3, -1 / 3, -1 / 3], [0] * 4, [0] * 4], atol=1e-6)


def brute_force_pass_at_k(correct: np.ndarray, k: int) -> np.ndarray:
    """Each response's mean over the size-k subsets holding it of (score - mean) / std, where a
    subset scores 1 when any member is correct and mean/std are over all subsets of the group."""
    out = np.zeros(correct.shape)
    for p, group in enumerate(correct):
        subsets = list(itertools.combinations(range(len(group)), k))
        scores = np.array([float(group[list(s)].any()) for s in subsets])
        std = scores.std()
        if std == 0:
            continue
        for i in range(len(group)):
            out[p, i] = np.mean([(sc - scores.mean()) / std for s, sc in zip(subsets, scores) if i in s])
    return out


@pytest.mark.parametrize("group, k", [(4, 1), (4, 2), (5, 3), (6, 4), (8, 8)])
def test_pass_at_k_equals_the_subset_enumeration(group, k):
    rng = np.random.default_rng(group * 10 + k)
    correct = rng.random((12, group)) < rng.random((12, 1))
    got = core.pass_at_k_advantages(correct.astype(np.float32), k=k)
    np.testing.assert_allclose(got, brute_force_pass_at_k(correct, k), rtol=1e-5, atol=1e-6)


def test_pass_at_1_is_grpo_with_the_population_std():
    rewards = (np.random.default_rng(0).random((16, 6)) < 0.5).astype(np.float32)
    np.testing.assert_allclose(core.pass_at_k_advantages(rewards, k=1),
                               core.grpo_advantages(rewards, ddof=0, eps=0.0), atol=1e-6)


def test_pass_at_k_refuses_k_outside_the_group():
    with pytest.raises(ValueError, match="k=5 is invalid for groups of 4"):
        core.pass_at_k_advantages(np.zeros((2, 4), np.float32), k=5)


def test_opo_hand_values_and_numpy_formulation():
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0]])
    # b = (3 * 1 + 1 * 0) / 4
    np.testing.assert_allclose(core.opo_advantages(np.array([[1.0, 0.0]], np.float32), mask),
                               [[0.25, 0.25, 0.25, 0], [-0.75, 0, 0, 0]])
    rng = np.random.default_rng(1)
    rewards = rng.normal(size=(5, 4)).astype(np.float32)
    mask = (np.arange(9)[None] < rng.integers(1, 10, size=(20, 1))).astype(np.int32)
    want = np.zeros(mask.shape)
    for p in range(5):
        rows = range(4 * p, 4 * p + 4)
        lengths = np.array([mask[i].sum() for i in rows], float)
        baseline = sum(lengths * rewards[p]) / lengths.sum()
        for g, i in enumerate(rows):
            want[i] = (rewards[p, g] - baseline) * mask[i]
    np.testing.assert_allclose(core.opo_advantages(rewards, mask), want, rtol=1e-5, atol=1e-6)


def sapo_numpy(logp, old_logp, adv, mask, tau_pos, tau_neg):
    ratio = np.exp(logp - old_logp)
    tau = np.where(adv > 0, tau_pos, tau_neg)
    return np.where(mask > 0, -4.0 / tau / (1.0 + np.exp(-tau * (ratio - 1.0))) * adv, 0.0)


def test_sapo_values_and_gradients():
    rng = np.random.default_rng(2)
    logp = rng.normal(-1.0, 0.3, (6, 7)).astype(np.float32)
    old = (logp + rng.normal(0, 0.4, logp.shape)).astype(np.float32)
    adv = rng.normal(size=logp.shape).astype(np.float32)
    mask = (rng.random(logp.shape) < 0.8).astype(np.int32)
    out = core.sapo_loss(logp, old, adv, mask, tau_pos=1.0, tau_neg=1.05)
    np.testing.assert_allclose(out.loss, sapo_numpy(logp, old, adv, mask, 1.0, 1.05), rtol=1e-5, atol=1e-6)
    grad = jax.grad(lambda x: core.sapo_loss(x, old, adv, mask).loss.sum())(logp)
    eps = 1e-3  # central differences of the numpy formulation in float64
    f = lambda x: sapo_numpy(x, old.astype(np.float64), adv.astype(np.float64), mask, 1.0, 1.05)  # noqa: E731
    fd = (f(logp.astype(np.float64) + eps) - f(logp.astype(np.float64) - eps)) / (2 * eps)
    np.testing.assert_allclose(grad, fd, rtol=2e-3, atol=1e-5)


def test_sapo_gradient_at_ratio_one_is_the_policy_gradient_and_the_gate_decays():
    logp = np.full((1, 3), -1.0, np.float32)
    adv = np.array([[1.0, -1.0, 2.0]], np.float32)
    mask = np.ones((1, 3), np.int32)
    grad_sapo = jax.grad(lambda x: core.sapo_loss(x, logp, adv, mask).loss.sum())(logp)
    grad_pg = jax.grad(lambda x: core.pg_loss(x, logp, adv, mask).loss.sum())(logp)
    np.testing.assert_allclose(grad_sapo, grad_pg, rtol=1e-6)  # -A at rho = 1
    far = logp + math.log(4.0)  # rho = 4: weight 4 s (1 - s) rho with s = sigmoid(3)
    grad_far = jax.grad(lambda x: core.sapo_loss(x, logp[:, :1], adv[:, :1], mask[:, :1]).loss.sum())(far[:, :1])
    s = 1 / (1 + math.exp(-3.0))
    np.testing.assert_allclose(grad_far, [[-4 * s * (1 - s) * 4.0]], rtol=1e-5)
    assert core.sapo_loss(far[:, :1], logp[:, :1], adv[:, :1], mask[:, :1]).clipped[0, 0] == 1.0


def test_the_config_runs_them_and_refuses_k_above_the_group():
    from jaxrl_llm.train.plan import plan_run

    cfg = apply_overrides(Config(), ["recipe.loss=sapo", "recipe.advantage=pass_at_4", "rollout.samples_per_prompt=4"])
    plan = plan_run(cfg)
    assert plan.recipe.policy_loss_fn.func is core.sapo_loss
    assert apply_overrides(Config(), ["recipe.advantage=opo"]).recipe.advantage == "opo"
    with pytest.raises(ConfigError, match="recipe.advantage = 'pass_at_8' scores subsets of 8 answers, but "
                                          "rollout.samples_per_prompt = 4"):
        apply_overrides(Config(), ["recipe.advantage=pass_at_8", "rollout.samples_per_prompt=4"])
