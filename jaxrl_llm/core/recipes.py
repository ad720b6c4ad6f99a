"""Named objectives as visible compositions of the core functions.

A Recipe is to the objectives what optax.chain is to optimisers: every piece
(advantage estimator, policy loss with its hyperparameters bound, aggregation
mode, mismatch correction, KL term, filters) is a field holding one of the
functions in this package, and the whole registry is in one place (RECIPES,
below). No flag inside a loss changes its meaning.

The advantage estimators a Recipe names are in core/estimators.py. What the learner
does with a Recipe (prepare_step_batch, recipe_loss, the StepBatch they pass between
them, micro_batches) is in core/step_batch.py.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax

from jaxrl_llm.core import (_checks, advantages as adv_lib, aggregation, corrections, entropy_control, gpg, kl, losses,
                            trust_region)
from jaxrl_llm.core.distill import Distillation
from jaxrl_llm.core.estimators import (  # noqa: F401 (re-exported: recipes name them)
    GaeAdvantage, GreedyBaselineAdvantage, GroupAdvantage, MonteCarloAdvantage, MultiRewardAdvantage, TokenAdvantage,
    TokenAdvantages)


@dataclasses.dataclass(frozen=True)
class OverlongPenalty:
    """DAPO soft overlong punishment added to rewards (see filters.overlong_penalty)."""

    max_length: int
    buffer: int
    factor: float = 1.0


KL_MODES = ("loss", "reward")


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One named objective, composed of core functions.

    Fields:
      name: registry key.
      advantage_fn: (rewards [P, G], mask [N, T], *, values) -> TokenAdvantages.
      policy_loss_fn: a losses.* function with its hyperparameters bound.
      aggregation: one of aggregation.AGGREGATION_MODES.
      constant_length: L_const for 'constant' aggregation (e.g. the maximum
        generation length); required there, unused otherwise.
      correction: a corrections.* function with its hyperparameters bound
        (token/sequence TIS/MIS, geometric rejection), or None.
      kl_beta: weight of the KL-to-reference term (0 = off).
      kl_estimator: 'k1', 'k2' or 'k3'.
      kl_mode: where the KL goes (KL_MODES): 'loss' adds beta * aggregate(k) to the
        loss (GRPO, Shao et al. 2024); 'reward' subtracts beta * k_t, computed with
        pi_old and detached, from the rewards before the advantages (Ouyang et al.
        2022; summed per response for estimators that take one reward per response).
      filter_zero_variance_groups: drop groups with all-equal rewards.
      mask_truncated: drop truncated responses (needs `truncated`).
      overlong: OverlongPenalty added to rewards, or None.
      dynamic_sampling: the sampler should over-sample prompts and keep only groups
        whose accuracy is neither 0 nor 1 until the batch is full (DAPO; done by the
        RL loop, train/sample/dynamic_sampling.py, not by these functions).
      value_coef, value_clip: critic loss weight and clip (used when
        recipe_loss gets `values`).
      token_selection: (advantages, old_logp, mask) -> [N, T] 0/1, the tokens a loss such as
        Clip-Cov / KL-Cov treats apart, picked once on the whole step batch by
        prepare_step_batch and passed to the loss as `selected=` (entropy_control.SELECTIONS);
        required by exactly those losses, None otherwise.
      distill: a `distill.Distillation` (on-policy distillation: the token advantages
        get log pi_teacher - log pi_old added; needs teacher_logp), or None.
      source: where the composition comes from.
    """

    name: str
    advantage_fn: Callable[..., TokenAdvantages]
    policy_loss_fn: Callable[..., losses.PolicyLossOutput]
    aggregation: str
    constant_length: float | None = None
    correction: Callable[..., corrections.CorrectionOutput] | None = None
    kl_beta: float = 0.0
    kl_estimator: str = "k3"
    kl_mode: str = "loss"
    filter_zero_variance_groups: bool = False
    mask_truncated: bool = False
    overlong: OverlongPenalty | None = None
    dynamic_sampling: bool = False
    value_coef: float = 0.0
    value_clip: float | None = None
    token_selection: Callable[..., jax.Array] | None = None
    distill: Distillation | None = None
    source: str = ""

    def __post_init__(self):
        aggregation.check_mode(self.aggregation)
        kl.get_kl_estimator(self.kl_estimator)
        if self.kl_mode not in KL_MODES:
            raise ValueError(f"kl_mode={self.kl_mode!r}; valid: {', '.join(KL_MODES)}")
        _checks.check_positive("kl_beta", self.kl_beta, allow_zero=True)
        loss_fn = getattr(self.policy_loss_fn, "func", self.policy_loss_fn)
        needs = loss_fn in entropy_control.SELECTIONS
        if needs != (self.token_selection is not None):
            raise ValueError(f"recipe {self.name!r}: token_selection is {self.token_selection} with policy loss "
                             f"{loss_fn.__name__}; the losses {[f.__name__ for f in entropy_control.SELECTIONS]} "
                             "need one (entropy_control.SELECTIONS), the others none")


_ppo = functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.2)
_grpo_std = GroupAdvantage(functools.partial(adv_lib.grpo_advantages, ddof=1, eps=1e-6))
_group_mean = GroupAdvantage(adv_lib.dr_grpo_advantages)

RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            name="grpo",
            advantage_fn=_grpo_std,
            policy_loss_fn=_ppo,
            aggregation="seq_mean_token_mean",
            source="Shao et al. 2024, DeepSeekMath (arXiv 2402.03300); the paper also adds "
            "a k3 KL with beta=0.04: get_recipe('grpo', kl_beta=0.04) to reproduce it",
        ),
        Recipe(
            name="dr_grpo",
            advantage_fn=_group_mean,
            policy_loss_fn=_ppo,
            aggregation="constant",
            constant_length=None,  # the maximum generation length: set it with get_recipe
            source="Liu et al. 2025, Dr. GRPO (arXiv 2503.20783)",
        ),
        Recipe(
            name="dapo",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.28),
            aggregation="token_mean",
            filter_zero_variance_groups=True,
            # the paper's soft overlong punishment; the RL loop rescales L_max to its generation
            # limit and keeps the buffer's share (4096 / 20480 = 20%)
            overlong=OverlongPenalty(max_length=20480, buffer=4096),
            dynamic_sampling=True,
            source="Yu et al. 2025, DAPO (arXiv 2503.14476): clip-higher, dynamic sampling, "
            "token-level loss, soft overlong punishment L_max=20480, buf=4096 (eq. 13)",
        ),
        Recipe(
            name="olmo3",
            advantage_fn=_group_mean,
            policy_loss_fn=functools.partial(losses.ppo_clip_loss, eps_low=0.2, eps_high=0.272),
            aggregation="token_mean",
            correction=functools.partial(corrections.token_tis, cap=2.0),
            filter_zero_variance_groups=True,
            source="Olmo Team 2025, Olmo 3 (arXiv 2512.13961) OlmoRL: no std, token-level "
            "loss, token TIS, clip-higher, zero-gradient filtering, no KL",
        ),
        Recipe(
            name="ppo",
            advantage_fn=GaeAdvantage(gamma=1.0, lam=0.95),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            value_coef=0.5,
            value_clip=0.2,
            source="Schulman et al. 2017 (PPO) with GAE (Schulman et al. 2016); terminal "
            "outcome reward, gamma=1 for LLM episodes",
        ),
        Recipe(
            name="rloo",
            advantage_fn=GroupAdvantage(adv_lib.rloo_advantages),
            policy_loss_fn=losses.pg_loss,
            aggregation="seq_mean_token_sum",
            source="Ahmadian et al. 2024 (arXiv 2402.14740): REINFORCE with a leave-one-out "
            "baseline, the whole response as one action",
        ),
        Recipe(
            name="remax",
            advantage_fn=GreedyBaselineAdvantage(),
            policy_loss_fn=losses.pg_loss,
            aggregation="seq_mean_token_sum",
            source="Li et al. 2023, ReMax (arXiv 2310.10505): REINFORCE with the reward of a greedy "
            "response to the same prompt as the baseline, the whole response as one action",
        ),
        Recipe(
            name="gdpo",
            advantage_fn=MultiRewardAdvantage(),
            policy_loss_fn=_ppo,
            aggregation="seq_mean_token_mean",
            source="Liu et al. 2026, GDPO (arXiv 2601.05242): GRPO with each of task.reward_fns normalised "
            "within its group, summed with task.reward_weights, then normalised over the batch",
        ),
        Recipe(
            name="reinforce_pp",
            advantage_fn=TokenAdvantage(adv_lib.reinforce_pp_advantages),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            source="Hu et al. 2025, REINFORCE++-baseline (arXiv 2501.03262)",
        ),
        Recipe(
            name="cispo",
            advantage_fn=_grpo_std,
            # eps_high is unpublished in MiniMax-M1; 4.0 (weights capped at 5) is our choice.
            policy_loss_fn=functools.partial(losses.cispo_loss, eps_low=None, eps_high=4.0),
            aggregation="token_mean",
            source="MiniMax 2025, MiniMax-M1 (arXiv 2506.13585)",
        ),
        Recipe(
            name="gspo",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(losses.gspo_loss, eps_low=3e-4, eps_high=4e-4),
            aggregation="seq_mean_token_mean",
            source="Zheng et al. 2025, GSPO (arXiv 2507.18071)",
        ),
        Recipe(
            name="precision_rl",
            advantage_fn=_grpo_std,
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            correction=functools.partial(corrections.sequence_mis, cap=10.0),
            source="Qi et al. 2025, Precision-RL (arXiv 2510.26788): GRPO with sequence-level "
            "masked importance sampling; pair it with FP16 sampler and learner",
        ),
        Recipe(
            name="vineppo",
            advantage_fn=MonteCarloAdvantage(),
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            source="Kazemnejad et al. 2024, VinePPO (arXiv 2410.01679): PPO-clip without a critic, "
            "chunk advantages from Monte-Carlo values of K continuations per chunk start",
        ),
        Recipe(
            name="dppo_tv",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(trust_region.dppo_tv_loss, threshold=0.15),
            aggregation="token_mean",
            source="Qi et al. 2026, DPPO-Binary-TV (arXiv 2602.04879): a trust region on the sampled "
            "token's probability change |p - p_old| <= 0.15 instead of the ratio clip",
        ),
        Recipe(
            name="dppo_kl",
            advantage_fn=_grpo_std,
            policy_loss_fn=functools.partial(trust_region.dppo_kl_loss, threshold=0.05),
            aggregation="token_mean",
            source="Qi et al. 2026, DPPO-Binary-KL (arXiv 2602.04879): binary KL(pi_old || pi) <= 0.05",
        ),
        *(Recipe(
            name=name,
            advantage_fn=_grpo_std,
            policy_loss_fn=loss_fn,
            aggregation="token_mean",
            token_selection=entropy_control.SELECTIONS[loss_fn],
            source=f"Cui et al. 2025, {label} (arXiv 2505.22617): entropy control on the top-covariance tokens",
        ) for name, label, loss_fn in (("clip_cov", "Clip-Cov", entropy_control.clip_cov_loss),
                                       ("kl_cov", "KL-Cov", entropy_control.kl_cov_loss))),
        Recipe(
            name="gpg",
            advantage_fn=GroupAdvantage(gpg.gpg_advantages),
            policy_loss_fn=losses.pg_loss,
            aggregation="token_mean",
            source="Chu et al. 2025, GPG (arXiv 2504.02546): REINFORCE on the group-centred reward "
            "scaled by B / (B - M), token-mean loss, no clip, no KL",
        ),
        Recipe(
            name="opd",
            advantage_fn=_grpo_std,  # the reward part, weighted by distill.reward_weight (0 here)
            policy_loss_fn=_ppo,
            aggregation="token_mean",
            distill=Distillation(reward_weight=0.0),
            source="on-policy distillation: advantage log pi_teacher - log pi_student per sampled token "
            "(reverse KL); Agarwal et al. 2024, GKD (arXiv 2306.13649); Lu et al. 2025, Thinking "
            "Machines Lab, 'On-Policy Distillation'",
        ),
    )
}


def get_recipe(name: str, **overrides) -> Recipe:
    """Returns RECIPES[name], with fields replaced by `overrides`.

    Example: get_recipe("dr_grpo", constant_length=1024).

    Raises:
      ValueError listing the valid names (or fields) for an unknown one.
    """
    if name not in RECIPES:
        raise ValueError(f"unknown recipe {name!r}; valid recipes: {', '.join(RECIPES)}")
    fields = {field.name for field in dataclasses.fields(Recipe)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise ValueError(f"unknown Recipe field(s) {unknown}; valid fields: {', '.join(sorted(fields))}")
    return dataclasses.replace(RECIPES[name], **overrides)
