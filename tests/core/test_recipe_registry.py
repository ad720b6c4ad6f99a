"""The advantage registry and `customize_recipe`, against values worked out by hand."""
import functools

import numpy as np
import pytest

from jaxrl_llm import core

MASK = np.ones((4, 3), np.float32)


@pytest.mark.parametrize("name, rewards, expected", [
    # mean 0.5, std (ddof=1) sqrt(1/3): (+-0.5) / 0.57735 = +-0.8660
    ("grpo", [[1.0, 0.0, 0.0, 1.0]], [0.8660254, -0.8660254, -0.8660254, 0.8660254]),
    ("dr_grpo", [[1.0, 0.0, 0.0, 0.0]], [0.75, -0.25, -0.25, -0.25]),
    # leave-one-out: r_i - mean of the other three
    ("rloo", [[1.0, 0.0, 0.0, 0.0]], [1.0, -1.0 / 3, -1.0 / 3, -1.0 / 3]),
    # pass@2 of one right in four: R = 1 - C(3,2)/C(4,2) = 1/2, s = 1/2 (tests/core/test_new_estimators.py)
    ("pass_at_2", [[1.0, 0.0, 0.0, 0.0]], [1.0, -1.0 / 3, -1.0 / 3, -1.0 / 3]),
    # OPO with equal lengths (MASK) is the group mean baseline
    ("opo", [[1.0, 0.0, 0.0, 0.0]], [0.75, -0.25, -0.25, -0.25]),
])
def test_group_advantages_by_name(name, rewards, expected):
    out = core.ADVANTAGES[name](np.asarray(rewards, np.float32), MASK)
    np.testing.assert_allclose(np.asarray(out.advantages)[:, 0], expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(out.advantages), np.repeat(np.asarray(expected)[:, None], 3, 1), rtol=1e-5)


def test_registry_names_every_estimator_the_config_offers():
    assert set(core.ADVANTAGES) == {"grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp", "gae", "vineppo", "opo",
                                    "pass_at_2", "pass_at_4", "pass_at_8", "grpo_passk", "gpg", "gpg_std", "remax", "gdpo"}
    with pytest.raises(ValueError, match="needs critic values|need critic values"):
        core.ADVANTAGES["gae"](np.ones((1, 4), np.float32), MASK)
    with pytest.raises(ValueError, match="VinePPO advantages come from extra rollouts"):
        core.ADVANTAGES["vineppo"](np.ones((1, 4), np.float32), MASK)
    with pytest.raises(ValueError, match="greedy response per prompt"):
        core.ADVANTAGES["remax"](np.ones((1, 4), np.float32), MASK)
    with pytest.raises(ValueError, match="GDPO needs each reward separately"):
        core.ADVANTAGES["gdpo"](np.ones((1, 4), np.float32), MASK)


def test_customize_keeps_bound_hyperparameters_and_replaces_named_parts():
    dapo = core.get_recipe("dapo")
    wider = core.customize_recipe(dapo, eps_high=0.4)
    assert wider.policy_loss_fn.func is core.ppo_clip_loss
    assert wider.policy_loss_fn.keywords == {"eps_low": 0.2, "eps_high": 0.4}
    assert wider.filter_zero_variance_groups and wider.aggregation == "token_mean"  # untouched parts stay
    cispo = core.customize_recipe(dapo, loss="cispo")  # a new loss starts from its own defaults
    assert cispo.policy_loss_fn.func is core.cispo_loss and cispo.policy_loss_fn.keywords == {}
    dual = core.customize_recipe(core.get_recipe("grpo"), dual_clip=3.0)
    assert dual.policy_loss_fn.keywords == {"eps_low": 0.2, "eps_high": 0.2, "dual_clip": 3.0}
    tis = core.customize_recipe(core.get_recipe("grpo"), correction="token_tis", correction_cap=4.0)
    assert tis.correction.func is core.token_tis and tis.correction.keywords == {"cap": 4.0}
    assert core.customize_recipe(core.get_recipe("olmo3"), correction="off").correction is None
    assert core.customize_recipe(dapo) == dapo


def test_customized_recipe_changes_the_loss_as_derived():
    """GRPO with Dr. GRPO's advantage and constant aggregation is Dr. GRPO: same loss value."""
    rewards = np.array([[1.0, 0.0, 0.0, 1.0]], np.float32)
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 1, 0]], np.float32)
    logp = np.log(np.full((4, 3), 0.5, np.float32))
    mixed = core.customize_recipe(core.get_recipe("grpo"), advantage="dr_grpo", aggregation="constant",
                                  constant_length=3)
    reference = core.get_recipe("dr_grpo", constant_length=3)
    losses = []
    for recipe in (mixed, reference):
        batch, _ = core.prepare_step_batch(recipe, core.StepInputs(rewards, mask, logp, logp))
        losses.append(float(core.recipe_loss(recipe, logp, batch)[0]))
    assert losses[0] == pytest.approx(losses[1], abs=1e-7)
    # By hand at ratio 1: loss = -sum_i A_i * L_i / (G * L_const) = -(0.5*3 - 0.5*1 - 0.5*1 + 0.5*2) / 12
    assert losses[0] == pytest.approx(-0.125, abs=1e-7)


def test_unknown_names_list_the_valid_ones():
    recipe = core.get_recipe("grpo")
    with pytest.raises(ValueError, match=r"unknown advantage 'grop'; valid: grpo, dr_grpo"):
        core.customize_recipe(recipe, advantage="grop")
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo'; valid: .*ppo_clip"):
        core.customize_recipe(recipe, loss="ppo")
    with pytest.raises(ValueError, match=r"unknown correction 'tis'; valid: .*token_tis"):
        core.customize_recipe(recipe, correction="tis")
    with pytest.raises(ValueError, match="has no correction"):
        core.customize_recipe(recipe, correction_cap=2.0)
    assert isinstance(core.customize_recipe(recipe, correction="token_tis").correction, functools.partial)
