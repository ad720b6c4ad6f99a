"""Recipes built by name: the advantage registry and `customize_recipe`, which replaces
parts of a named recipe (advantage, loss, aggregation, correction, KL, filters) with
registry entries and hyperparameters, e.g. from a run's config."""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from jaxrl_llm.core import (advantages as adv_lib, corrections, entropy_control, gpg, losses, off_policy,
                            pass_at_k_tang, trust_region)
from jaxrl_llm.core.recipes import (GaeAdvantage, GreedyBaselineAdvantage, GroupAdvantage, MonteCarloAdvantage,
                                    MultiRewardAdvantage, Recipe, TokenAdvantage, TokenAdvantages)

# Advantage estimators by name, like losses.POLICY_LOSSES and corrections.CORRECTIONS.
# "gae" needs critic values (StepInputs.values); the others' extra inputs are their `inputs`
# (StepInputs.extras): "vineppo" the Monte-Carlo chunk advantages of extra rollouts, "remax" each
# prompt's greedy reward, "gdpo" each grader's reward.
ADVANTAGES: dict[str, Callable[..., TokenAdvantages]] = {
    "grpo": GroupAdvantage(adv_lib.grpo_advantages),
    "dr_grpo": GroupAdvantage(adv_lib.dr_grpo_advantages),
    "rloo": GroupAdvantage(adv_lib.rloo_advantages),
    "batch_std": GroupAdvantage(adv_lib.batch_std_advantages),
    "reinforce_pp": TokenAdvantage(adv_lib.reinforce_pp_advantages),
    "opo": TokenAdvantage(adv_lib.opo_advantages),
    **{f"pass_at_{k}": GroupAdvantage(functools.partial(adv_lib.pass_at_k_advantages, k=k)) for k in (2, 4, 8)},
    "grpo_passk": GroupAdvantage(pass_at_k_tang.pass_at_k_tang_advantages),  # Tang et al., verl's name
    "gpg": GroupAdvantage(gpg.gpg_advantages),
    "gpg_std": GroupAdvantage(functools.partial(gpg.gpg_advantages, normalize_std=True)),
    "gae": GaeAdvantage(gamma=1.0, lam=1.0),
    "vineppo": MonteCarloAdvantage(),
    "remax": GreedyBaselineAdvantage(),
    "gdpo": MultiRewardAdvantage(),
}


# Every correction by name: core/corrections.py's and the peers' of core/off_policy.py.
CORRECTIONS: dict[str, Callable] = {**corrections.CORRECTIONS, **off_policy.CORRECTIONS}

# Every policy loss by name: core/losses.py's, DPPO's (trust_region) and Clip-/KL-Cov (entropy_control).
POLICY_LOSSES: dict[str, Callable] = {**losses.POLICY_LOSSES, **trust_region.POLICY_LOSSES,
                                      **entropy_control.POLICY_LOSSES}


def _named(registry: dict, kind: str, name: str):
    if name not in registry:
        raise ValueError(f"unknown {kind} {name!r}; valid: {', '.join(registry)}")
    return registry[name]


def _bound_parts(fn) -> tuple[Callable | None, dict]:
    """(function, bound keywords) of a functools.partial, or (fn, {}) of a plain function."""
    if isinstance(fn, functools.partial):
        return fn.func, dict(fn.keywords)
    return fn, {}


def customize_recipe(
    recipe: Recipe,
    *,
    advantage: str | None = None,
    loss: str | None = None,
    aggregation: str | None = None,
    constant_length: float | None = None,
    eps_low: float | None = None,
    eps_high: float | None = None,
    dual_clip: float | None = None,
    kl_beta: float | None = None,
    kl_estimator: str | None = None,
    kl_mode: str | None = None,
    correction: str | None = None,
    correction_cap: float | None = None,
    correction_params: dict | None = None,
    filter_zero_variance_groups: bool | None = None,
    loss_params: dict | None = None,
    selection_params: dict | None = None,
) -> Recipe:
    """`recipe` with the named parts replaced; None keeps the recipe's own choice.

    Names come from the registries (ADVANTAGES, losses.POLICY_LOSSES,
    aggregation.AGGREGATION_MODES, kl.KL_ESTIMATORS, CORRECTIONS;
    correction="off" removes the correction). Hyperparameters (eps_low,
    eps_high, dual_clip, correction_cap) are bound onto the recipe's loss or
    correction, keeping its other bound values, unless `loss` / `correction`
    names a new function, which then starts from its own defaults. `loss_params` are
    further keywords bound the same way (e.g. {"threshold": 0.1} for DPPO, {"tau_pos": 2.0}
    for SAPO), `correction_params` the same onto the correction (e.g. {"low": 0.99, "high": 1.01});
    `selection_params` are bound onto the recipe's token selection (Clip-Cov /
    KL-Cov: fraction, lower, upper). A loss that needs a token selection
    (entropy_control.SELECTIONS) gets its default one when named; another loss drops it.

    Example: customize_recipe(get_recipe("grpo"), aggregation="constant",
    constant_length=1024) is GRPO with Dr. GRPO's aggregation.

    Raises ValueError naming the bad value and the valid ones.
    """
    over: dict = {k: v for k, v in dict(aggregation=aggregation, constant_length=constant_length, kl_beta=kl_beta,
                                         kl_estimator=kl_estimator, kl_mode=kl_mode,
                                         filter_zero_variance_groups=filter_zero_variance_groups).items()
                  if v is not None}
    if advantage is not None:
        over["advantage_fn"] = _named(ADVANTAGES, "advantage", advantage)
    loss_kw = {k: v for k, v in dict(eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip).items() if v is not None}
    loss_kw.update(loss_params or {})
    fn, bound = _bound_parts(recipe.policy_loss_fn)
    selection = recipe.token_selection
    if loss is not None:
        fn, bound = _named(POLICY_LOSSES, "policy loss", loss), {}
        selection = entropy_control.SELECTIONS.get(fn)
    if loss is not None or loss_kw:
        over["policy_loss_fn"] = functools.partial(fn, **{**bound, **loss_kw})
    if selection_params:
        if selection is None:
            raise ValueError(f"selection_params {selection_params} are set but the policy loss {fn.__name__} "
                             f"selects no tokens; valid with: {[f.__name__ for f in entropy_control.SELECTIONS]}")
        select_fn, select_bound = _bound_parts(selection)
        selection = functools.partial(select_fn, **{**select_bound, **selection_params})
    over["token_selection"] = selection
    correction_kw = {**({"cap": correction_cap} if correction_cap is not None else {}), **(correction_params or {})}
    given = " and ".join((["correction_cap"] if correction_cap is not None else [])
                         + ([f"correction_params {correction_params}"] if correction_params else []))
    if correction == "off":
        if correction_kw:
            raise ValueError(f"{given} is set but correction='off'; set one or the other")
        over["correction"] = None
    elif correction is not None or correction_kw:
        fn, bound = _bound_parts(recipe.correction)
        if correction is not None:
            fn, bound = _named(CORRECTIONS, "correction", correction), {}
        if fn is None:
            raise ValueError(f"{given} is set but recipe {recipe.name!r} has no correction; name one "
                             f"(valid: {', '.join(CORRECTIONS)})")
        over["correction"] = functools.partial(fn, **{**bound, **correction_kw})
    return dataclasses.replace(recipe, **over)
