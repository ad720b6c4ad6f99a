"""Issue 48: DPPO with separate lower / upper radii, GPG's std-normalised option and Tang et al.'s
pass@k advantage (verl's grpo_passk): hand values and numpy loops written apart from the code."""
import math

import jax
import numpy as np
import pytest

from jaxrl_llm import core

# ------------------------------------------------------------------------------- DPPO, two radii


def test_dppo_tv_two_radii_hand_values():
    old = np.log(np.full((1, 4), 0.5, np.float32))
    p = np.array([[0.65, 0.75, 0.45, 0.35]], np.float32)
    adv = np.array([[1.0, 1.0, -1.0, -1.0]], np.float32)
    logp, mask = np.log(p), np.ones_like(p)
    out = core.dppo_tv_loss(logp, old, adv, mask, threshold_low=0.1, threshold_high=0.2)
    # up (A > 0): .15 <= .2 kept, .25 > .2 masked; down (A < 0): .05 <= .1 kept, .15 > .1 masked
    np.testing.assert_array_equal(out.clipped, [[0, 1, 0, 1]])
    weight = np.array([1.3, 0.0, 0.9, 0.0])  # rho = p / .5 on the kept tokens
    np.testing.assert_allclose(out.loss, [-weight * adv[0] * logp[0]], rtol=1e-5)
    symmetric = core.dppo_tv_loss(logp, old, adv, mask, threshold=0.1)  # the paper's single radius
    np.testing.assert_array_equal(symmetric.clipped, [[1, 1, 0, 1]])


def _dppo_loop(logp, old, adv, mask, *, form, low, high, cap=20.0):
    """Per token, in float64: the loss -min(rho, C) A log pi unless the update leaves pi_old past the
    radius of its direction (high when A > 0 raises p, low otherwise)."""
    loss = np.zeros(logp.shape)
    for i, t in np.ndindex(logp.shape):
        if not mask[i, t]:
            continue
        p, q = math.exp(logp[i, t]), math.exp(old[i, t])
        if form == "tv":
            divergence = abs(p - q)
        else:
            divergence = q * math.log(q / p) + (1 - q) * math.log((1 - q) / (1 - p))
        if adv[i, t] > 0:
            masked = p > q and divergence > high
        else:
            masked = p < q and divergence > low
        if not masked:
            loss[i, t] = -min(p / q, cap) * adv[i, t] * logp[i, t]
    return loss


@pytest.mark.parametrize("form", ["tv", "kl"])
def test_dppo_two_radii_match_a_loop_and_equal_radii_are_the_symmetric_loss(form):
    rng = np.random.default_rng(4)
    old = np.log(rng.uniform(0.02, 0.98, (8, 9))).astype(np.float32)
    logp = np.log(np.clip(np.exp(old) + rng.normal(0, 0.2, old.shape), 0.01, 0.99)).astype(np.float32)
    adv = rng.normal(size=old.shape).astype(np.float32)
    mask = (rng.random(old.shape) < 0.85).astype(np.float32)
    fn, low, high = (core.dppo_tv_loss, 0.08, 0.2) if form == "tv" else (core.dppo_kl_loss, 0.02, 0.08)
    out = fn(logp, old, adv, mask, threshold_low=low, threshold_high=high)
    expected = _dppo_loop(logp.astype(np.float64), old.astype(np.float64), adv, mask, form=form, low=low, high=high)
    np.testing.assert_allclose(out.loss, expected, rtol=1e-4, atol=1e-5)
    one = fn(logp, old, adv, mask, threshold=low)
    both = fn(logp, old, adv, mask, threshold=0.5, threshold_low=low, threshold_high=low)
    np.testing.assert_array_equal(one.loss, both.loss)
    assert float(np.sum(one.clipped)) > float(np.sum(out.clipped))  # the wider upper radius masks fewer


# ----------------------------------------------------------------------------- GPG, std option


def test_gpg_std_hand_values():
    rewards = np.array([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]], np.float32)
    # B = 8, M = 4 (the constant group): alpha = 2; group 0 centred +-.5, std (ddof 1) = sqrt(1/3)
    a = 2 * 0.5 / (math.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(core.gpg_advantages(rewards, normalize_std=True), [[a, -a, -a, a], [0, 0, 0, 0]],
                               rtol=1e-6)
    np.testing.assert_allclose(core.gpg_advantages(rewards), [[1, -1, -1, 1], [0, 0, 0, 0]], rtol=1e-6)


def test_gpg_std_matches_a_loop():
    rng = np.random.default_rng(5)
    rewards = rng.integers(0, 3, (6, 5)).astype(np.float32)
    rewards[2] = 1.0  # one constant group
    constant = sum(len(set(row.tolist())) == 1 for row in rewards)
    alpha = rewards.size / (rewards.size - constant * rewards.shape[1])
    expected = np.zeros(rewards.shape)
    for i, row in enumerate(rewards.astype(np.float64)):
        if len(set(row.tolist())) > 1:
            expected[i] = alpha * (row - row.mean()) / (row.std(ddof=1) + 1e-6)
    np.testing.assert_allclose(jax.jit(lambda r: core.gpg_advantages(r, normalize_std=True))(rewards), expected,
                               rtol=1e-5)


# ------------------------------------------------------------------------- Tang et al.'s pass@k


def test_pass_at_k_tang_hand_values():
    rewards = np.array([[0.2, 0.9, 0.5, 0.1], [0.0, 1.0, 0.0, 0.0], [1.0, 1.0, 0.0, 0.0], [0.3, 0.3, 0.3, 0.3]],
                       np.float32)
    # row 0: margin .9 - .5 = .4 over std(.2, .9, .5, .1; ddof 1) = sqrt(.3875 / 3); row 1: 1 / .5;
    # rows 2, 3: the two best tie, so nobody is credited
    got = core.pass_at_k_tang_advantages(rewards)
    np.testing.assert_allclose(got, [[0, 0.4 / (math.sqrt(0.3875 / 3) + 1e-6), 0, 0], [0, 1 / (0.5 + 1e-6), 0, 0],
                                     [0, 0, 0, 0], [0, 0, 0, 0]], rtol=1e-5)
    np.testing.assert_allclose(core.pass_at_k_tang_advantages(rewards, normalize_std=False)[:2],
                               [[0, 0.4, 0, 0], [0, 1, 0, 0]], rtol=1e-5)
    assert core.ADVANTAGES["grpo_passk"].estimator is core.pass_at_k_tang_advantages
    with pytest.raises(ValueError, match="at least 2"):
        core.pass_at_k_tang_advantages(np.ones((3, 1), np.float32))


def test_pass_at_k_tang_matches_a_loop_and_differs_from_chen():
    rng = np.random.default_rng(6)
    rewards = rng.uniform(0.0, 1.0, (7, 6)).astype(np.float32)
    expected = np.zeros(rewards.shape)
    for i, row in enumerate(rewards.astype(np.float64).tolist()):
        ranked = sorted(row, reverse=True)
        expected[i, row.index(ranked[0])] = (ranked[0] - ranked[1]) / (np.std(row, ddof=1) + 1e-6)
    np.testing.assert_allclose(core.pass_at_k_tang_advantages(rewards), expected, rtol=1e-5)
    binary = np.array([[1.0, 0.0, 0.0, 0.0]], np.float32)  # Chen et al. credit every answer, Tang only the best
    assert np.count_nonzero(core.pass_at_k_advantages(binary, k=2)) == 4
    assert np.count_nonzero(core.pass_at_k_tang_advantages(binary)) == 1
