"""The closed-form length drift (reports/length_drift.py) against the gradient of the
learner's loss, enumerated exactly over every outcome of hand-built groups.

The policy here is the derivation's own: after a one-token answer it stops at each free
position with probability q = sigmoid(theta_c), theta_c one logit for contexts after a right
(c = 0) or a wrong (c = 1) answer. Each response's per-token log-probs are written as
functions of theta, the step goes through `core.prepare_step_batch` + `core.recipe_loss`
(the function `train.learner.Learner` differentiates), and jax.grad gives d loss / d theta
for every combination of free lengths; weighting by the combinations' probabilities gives
the exact expected drift, which the closed form must equal."""
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_llm import core
from jaxrl_llm.reports import length_drift

ANSWER_TOKENS, MAX_TOKENS = 1, 4  # K = 3 free positions: stop after 1, 2, 3 or truncated
ANSWER_LOGP = math.log(0.5)


def outcome_arrays(outcomes, correct, theta):
    """mask [N, T] and log-probs [N, T] (functions of theta) of responses whose free part ended
    in `outcomes` [N] (index o < K: stopped after o + 1 free tokens; o = K: truncated)."""
    free = MAX_TOKENS - ANSWER_TOKENS
    q = jax.nn.sigmoid(theta)[np.where(correct, 0, 1)][:, None]  # theta[0]: after a right answer
    stopped = (outcomes < free)[:, None]
    j = jnp.minimum(outcomes + 1, free)[:, None]  # free tokens of each response
    t = jnp.arange(MAX_TOKENS)[None, :] - ANSWER_TOKENS + 1  # 1 .. K on the free positions
    mask = (t <= j).astype(jnp.float32)
    logp = jnp.where(t <= 0, ANSWER_LOGP, jnp.where((t == j) & stopped, jnp.log(q), jnp.log1p(-q)))
    return mask, logp * mask


def expected_loss_gradient(recipe, rewards, q):
    """E over all free-length combinations of d loss / d (theta_right, theta_wrong)."""
    correct = np.asarray(rewards).reshape(-1) >= 1
    theta = jnp.full((2,), math.log(q / (1 - q)), jnp.float32)
    dist = length_drift.free_lengths(q, ANSWER_TOKENS, MAX_TOKENS)

    def loss(theta, outcomes):
        mask, logp = outcome_arrays(outcomes, correct, theta)
        step, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards, jnp.float32), mask, logp))
        return core.recipe_loss(recipe, logp, step)[0]

    combos = np.array(list(itertools.product(range(dist.prob.size), repeat=correct.size)))
    grads = jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0)))(theta, jnp.asarray(combos))
    weights = np.prod(dist.prob[combos], axis=1)
    assert weights.sum() == pytest.approx(1.0)
    return weights @ np.asarray(grads, np.float64)


# Advantages by hand: rewards [1, 0, 0, 1] -> mean 1/2; ddof=1 std sqrt(4 (1/2)^2 / 3) = 1/sqrt(3),
# so GRPO / DAPO give +-sqrt(3)/2 and Dr. GRPO +-1/2. [1, 0, 0, 0]: mean 1/4, std sqrt(3/16 * 4/3) = 1/2:
# GRPO +3/2, -1/2; Dr. GRPO +3/4, -1/4.
CASES = [
    ("grpo", [[1, 0, 0, 1]], [math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2]),
    ("grpo", [[1, 0, 0, 0]], [1.5, -0.5, -0.5, -0.5]),
    ("dr_grpo", [[1, 0, 0, 1]], [0.5, -0.5, -0.5, 0.5]),
    ("dr_grpo", [[1, 0, 0, 0]], [0.75, -0.25, -0.25, -0.25]),
    ("dapo", [[1, 0, 0, 1]], [math.sqrt(3) / 2, -math.sqrt(3) / 2, -math.sqrt(3) / 2, math.sqrt(3) / 2]),
    ("dapo", [[1, 0, 0, 0]], [1.5, -0.5, -0.5, -0.5]),
]


@pytest.mark.parametrize("name,rewards,advantages", CASES)
@pytest.mark.parametrize("q", [0.3, 0.6])
def test_closed_form_drift_equals_the_expected_gradient_of_the_real_loss(name, rewards, advantages, q):
    recipe = core.get_recipe(name, **({"constant_length": MAX_TOKENS} if name == "dr_grpo" else {}))
    ascent = -expected_loss_gradient(recipe, rewards, q)
    correct = np.asarray(rewards).reshape(-1) >= 1
    drift = length_drift.expected_stop_drift(recipe.aggregation, q, np.asarray(advantages), correct,
                                             answer_tokens=ANSWER_TOKENS, max_tokens=MAX_TOKENS,
                                             constant_length=recipe.constant_length)
    assert ascent == pytest.approx([drift.right, drift.wrong], abs=2e-6, rel=2e-5)
    if name == "dr_grpo":  # a constant normaliser: no drift in expectation
        assert np.abs(ascent).max() < 1e-6
    else:  # wrong answers: the stop logit falls (they lengthen); right answers: it rises
        assert ascent[1] < -1e-4 < 1e-4 < ascent[0]


def test_grpo_drift_by_hand_for_one_case():
    """q = 1/2, one answer token, K = 3: outcomes j = 1, 2, 3 with P = 1/2, 1/4, 1/8 and
    s = 1/2, 0, -1/2 at L = 2, 3, 4; truncated P = 1/8, s = -3/2, L = 4.
    E[s/L] = (1/2)(1/2)/2 + 0 + (1/8)(-1/2)/4 + (1/8)(-3/2)/4 = 1/8 - 1/64 - 3/64 = 1/16."""
    d = length_drift.expected_weighted_score("seq_mean_token_mean", 0.5, answer_tokens=1, max_tokens=4,
                                             num_responses=1)
    assert d == pytest.approx(1 / 16)
    dist = length_drift.free_lengths(0.5, 1, 4)
    assert np.sum(dist.prob) == pytest.approx(1.0) and np.sum(dist.prob * dist.score) == pytest.approx(0.0)


@pytest.mark.parametrize("q", [0.05, 0.2, 0.5])
def test_token_mean_sits_between_grpo_and_a_constant_normaliser_at_about_one_over_n(q):
    kwargs = dict(answer_tokens=1, max_tokens=16, num_responses=32)
    grpo = length_drift.relative_push("seq_mean_token_mean", q, **kwargs)
    token_mean = length_drift.relative_push("token_mean", q, **kwargs)
    constant = length_drift.relative_push("constant", q, constant_length=16, **kwargs)
    assert grpo > token_mean > 0 and constant == pytest.approx(0.0, abs=1e-12)
    assert token_mean * 32 == pytest.approx(grpo, rel=0.6)  # ~1/N of GRPO's push


def test_bad_stop_probability_and_mode_are_named():
    with pytest.raises(ValueError, match="q=1.5"):
        length_drift.free_lengths(1.5, 1, 4)
    with pytest.raises(ValueError, match="valid: seq_mean_token_mean"):
        length_drift.expected_weighted_score("mean", 0.5, answer_tokens=1, max_tokens=4, num_responses=2)
