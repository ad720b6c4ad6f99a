"""Advantage estimators as the objects a Recipe names (`Recipe.advantage_fn`): each takes the
step's rewards [P, G] and the response mask [N, T] (plus the extras it declares in `inputs`,
which `prepare_step_batch` passes from `StepInputs.extras` by those names, as keyword arguments)
and returns per-token advantages. docs/architecture.md, "Adding an advantage estimator", lists
the files a new one touches.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import ClassVar, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks, advantages as adv_lib, multi_reward, remax


def fold_sequence_rewards(rewards, token_rewards):
    """rewards [P, G] plus each response's summed per-token rewards [N, T] (None: unchanged)."""
    if token_rewards is None:
        return rewards
    return rewards + jnp.sum(token_rewards, axis=1).reshape(jnp.shape(rewards))


class TokenAdvantages(NamedTuple):
    advantages: jax.Array  # [N, T]
    returns: jax.Array | None  # [N, T] critic targets, only for estimators with a critic


@dataclasses.dataclass(frozen=True)
class GroupAdvantage:
    """A per-response estimator ([P, G] -> [P, G]) broadcast onto tokens."""

    estimator: Callable[[jax.Array], jax.Array]

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: optional [N, T] per-token rewards (e.g. a KL penalty), summed over
        each response into its scalar reward, since the estimator sees one reward per response."""
        rewards = fold_sequence_rewards(rewards, token_rewards)
        return TokenAdvantages(adv_lib.broadcast_to_tokens(self.estimator(rewards), mask), None)


@dataclasses.dataclass(frozen=True)
class TokenAdvantage:
    """An estimator that is token-level already ((rewards, mask) -> [N, T])."""

    estimator: Callable[[jax.Array, jax.Array], jax.Array]

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: as GroupAdvantage (summed into each response's reward)."""
        return TokenAdvantages(self.estimator(fold_sequence_rewards(rewards, token_rewards), mask), None)


@dataclasses.dataclass(frozen=True)
class GaeAdvantage:
    """GAE on the outcome reward placed on each response's last valid token."""

    gamma: float
    lam: float

    def __call__(self, rewards, mask, *, values=None, token_rewards=None) -> TokenAdvantages:
        """token_rewards: optional [N, T] per-token rewards added where they occur (a
        per-token KL penalty, as in Ouyang et al. 2022), on top of the terminal reward."""
        if values is None:
            raise ValueError("GAE advantages need critic values [N, T]: set StepInputs.values")
        placed = adv_lib.terminal_token_rewards(rewards, mask)
        if token_rewards is not None:
            placed = placed + jnp.where(_checks.valid_tokens(mask), token_rewards, 0.0)
        out = adv_lib.gae_advantages(placed, values, mask, gamma=self.gamma, lam=self.lam)
        return TokenAdvantages(out.advantages, out.returns)


@dataclasses.dataclass(frozen=True)
class MonteCarloAdvantage:
    """VinePPO (Kazemnejad et al. 2024, arXiv 2410.01679): each token gets its chunk's
    advantage V(b_{j+1}) - V(b_j), with V Monte-Carlo estimates from extra rollouts of the
    response's prefixes (`vineppo.chunk_advantages`). Those rollouts need the rollout
    engine, so the advantages are estimated outside the step (the RL loop:
    train/sample/vineppo_step.py) and enter as `StepInputs.extras["advantages"]`; this
    estimator only places them on the valid tokens (filtered tokens get 0)."""

    inputs: ClassVar[tuple[str, ...]] = ("advantages",)  # the StepInputs.extras it needs, by name

    def __call__(self, rewards, mask, *, values=None, token_rewards=None, advantages=None) -> TokenAdvantages:
        if advantages is None:
            raise ValueError("VinePPO advantages come from extra rollouts: put them in StepInputs.extras['advantages'] "
                             "[N, T] (the RL loop's train/sample/vineppo_step.py estimates them)")
        if token_rewards is not None:
            raise ValueError("VinePPO's Monte-Carlo values are of the graders' rewards; per-token rewards "
                             "(kl_mode='reward') are not part of them: use kl_mode='loss'")
        _checks.check_same_shape(advantages=advantages, mask=mask)
        valid = _checks.valid_tokens(mask)
        return TokenAdvantages(jnp.where(valid, _checks.to_float32(advantages), 0.0), None)


@dataclasses.dataclass(frozen=True)
class GreedyBaselineAdvantage:
    """ReMax (Li et al. 2023, arXiv 2310.10505; `remax.remax_advantages`): each group's baseline
    is the reward of a greedy response to its prompt, which the RL loop draws and grades with the
    group (train/sample/stage.py) and passes as `StepInputs.extras["baseline_rewards"]` [P]."""

    inputs: ClassVar[tuple[str, ...]] = ("baseline_rewards",)

    def __call__(self, rewards, mask, *, values=None, token_rewards=None, baseline_rewards=None) -> TokenAdvantages:
        """token_rewards (kl_mode='reward'): summed into each sampled response's reward."""
        if baseline_rewards is None:
            raise ValueError("ReMax's baseline is the reward of a greedy response per prompt: put it in "
                             "StepInputs.extras['baseline_rewards'] [P] (the RL loop draws and grades them)")
        advantages = remax.remax_advantages(fold_sequence_rewards(rewards, token_rewards), baseline_rewards)
        return TokenAdvantages(adv_lib.broadcast_to_tokens(advantages, mask), None)


@dataclasses.dataclass(frozen=True)
class MultiRewardAdvantage:
    """GDPO (Liu et al. 2026, arXiv 2601.05242; `multi_reward.gdpo_advantages`) over each grader's
    reward, `StepInputs.extras["reward_parts"]` [P, G, K], with `weights` (the run's
    task.reward_weights; None: 1 for every reward)."""

    weights: tuple[float, ...] | None = None
    inputs: ClassVar[tuple[str, ...]] = ("reward_parts",)

    def __call__(self, rewards, mask, *, values=None, token_rewards=None, reward_parts=None) -> TokenAdvantages:
        if token_rewards is not None:
            raise ValueError("GDPO normalises each grader's reward; per-token rewards (kl_mode='reward') are not "
                             "one of them: use kl_mode='loss'")
        if reward_parts is None:
            raise ValueError("GDPO needs each reward separately: put them in StepInputs.extras['reward_parts'] "
                             "[P, G, K]")
        weights = self.weights if self.weights is not None else (1.0,) * jnp.shape(reward_parts)[2]
        advantages = multi_reward.gdpo_advantages(reward_parts, weights)
        return TokenAdvantages(adv_lib.broadcast_to_tokens(advantages, mask), None)
