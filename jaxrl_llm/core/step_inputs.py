"""One step's data from the sampler to the loss: `StepInputs`, what `prepare_step_batch`
(core/step_batch.py) takes whole.

The sampling stage fills the sampler's part (rewards, correct, `extras`), the learner adds its
own (mask, pi_old and the other log-probs, values, truncation), and `prepare_step_batch` hands
the recipe's advantage estimator the extras it declares in its `inputs`
(`estimator_inputs`). An extra is keyed by that name: VinePPO's "advantages" [N, T], ReMax's
"baseline_rewards" [P], GDPO's "reward_parts" [P, G, K].

An extra's leading axis says what it is indexed by: P (one entry per prompt) or N = P * G (one
per response row). `mini_batch` slices by it; with G = 1 the two coincide and so do the slices.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax.numpy as jnp


class StepInputs(NamedTuple):
    """Everything `prepare_step_batch` reads, as one pytree (a NamedTuple: jit, tree.map and
    slicing see its arrays; a None field is an input this step does not have).

    rewards: [P, G] scalar rewards (the learner's: after shaping).
    mask: [N, T] response mask, N = P * G, prompt-major rows.
    old_logp: [N, T] learner log-probs before the update (pi_old).
    sampler_logp: [N, T] rollout-engine log-probs (mu); needed by corrections.
    ref_logp: [N, T] reference log-probs; needed when recipe.kl_beta > 0.
    teacher_logp: [N, T] a frozen teacher's log-probs of the sampled tokens; needed by, and only
      accepted with, a recipe with `distill`.
    values: [N, T] critic values at rollout time; needed by GAE.
    truncated: [N] bool (no EOS); needed when recipe.mask_truncated.
    correct: [P, G] the graders' verdicts (bool or 0/1) the zero-variance filter judges; None:
      it judges `rewards` (before the overlong penalty).
    extras: the estimator's further inputs by the names in its `inputs` (see the module doc);
      one the recipe's estimator does not declare is refused. Never mutated: build a new one with
      `_replace(extras={**inputs.extras, name: value})`.
    """

    rewards: Any
    mask: Any = None
    old_logp: Any = None
    sampler_logp: Any = None
    ref_logp: Any = None
    teacher_logp: Any = None
    values: Any = None
    truncated: Any = None
    correct: Any = None
    extras: Mapping[str, Any] = {}


def estimator_inputs(recipe) -> tuple[str, ...]:
    """The names of the extras the recipe's advantage estimator declares (`inputs`; () if none)."""
    return tuple(getattr(recipe.advantage_fn, "inputs", ()))


def estimator_extras(recipe, inputs: StepInputs) -> dict[str, Any]:
    """{name: extra} for every name the recipe's estimator declares (a missing one as None: the
    estimator says what it needs). Raises ValueError naming an extra it does not declare."""
    needs = estimator_inputs(recipe)
    unknown = [name for name, value in inputs.extras.items() if value is not None and name not in needs]
    if unknown:
        raise ValueError(f"extras {unknown} given, but recipe {recipe.name!r}'s advantage {recipe.advantage_fn} "
                         f"does not declare them (its inputs: {list(needs) or 'none, only the rewards'})")
    return {name: inputs.extras.get(name) for name in needs}


def mini_batch(inputs: StepInputs, index: int, count: int) -> StepInputs:
    """Mini-batch `index` of `count` equal ones, whole prompt groups each: prompt rows of the
    [P, ...] arrays (rewards, correct, per-prompt extras), response rows of the [N, ...] ones."""
    prompts, group = jnp.shape(inputs.rewards)
    if count < 1 or prompts % count:
        raise ValueError(f"cannot split {prompts} prompts into {count} equal mini-batches")
    size = prompts // count
    by_prompt, by_row = slice(index * size, (index + 1) * size), slice(index * size * group, (index + 1) * size * group)

    def rows(name: str, x):
        if x is None:
            return None
        lead = jnp.shape(x)[0]
        if lead not in (prompts, prompts * group):
            raise ValueError(f"{name} has leading axis {lead}; valid: P = {prompts} (per prompt) or "
                             f"N = {prompts * group} (per response)")
        return x[by_prompt] if lead == prompts else x[by_row]

    fields = {name: rows(name, x) for name, x in inputs._asdict().items() if name != "extras"}
    return StepInputs(**fields, extras={name: rows(f"extras[{name!r}]", x) for name, x in inputs.extras.items()})

