"""The extra inputs of advantage estimators that the sampling stage computes from a step's grades
(`core.StepInputs.extras`, by the names an estimator declares in its `inputs`).

`EXTRA_INPUTS` maps such a name to a function (graded, rollouts) -> array, run by the plain
sampling mode after grading, shaping and VinePPO (`stage.PlainBatch.grade` -> `fill_extras`). Its
leading axis is P (one entry per prompt) or N = P * G (one per learner row, prompt-major); the
learner slices it by that axis into mini-batches (`core.mini_batch`). An extra that needs the
rollout engine is filled inside the mode instead: ReMax's greedy rows ("baseline_rewards",
`stage.greedy_baseline`), VinePPO's continuations ("advantages", `vineppo_step`). Adding an
estimator: docs/architecture.md, "Adding an advantage estimator".
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from jaxrl_llm.rollout.types import RolloutBatch
from jaxrl_llm.train.sample.grading import Graded

ExtraInput = Callable[[Graded, RolloutBatch], np.ndarray]


def reward_parts(graded: Graded, rollouts: RolloutBatch) -> np.ndarray:
    """GDPO (`core.MultiRewardAdvantage`): each grader's reward, [P, G, K] in task.reward_fns' order."""
    return np.stack(list(graded.parts.values()), axis=-1)


EXTRA_INPUTS: dict[str, ExtraInput] = {
    "reward_parts": reward_parts,
}


def fill_extras(graded: Graded, rollouts: RolloutBatch, needs: Sequence[str]) -> Graded:
    """`graded` with every extra in `needs` (the recipe's estimator's `inputs`) that the mode has
    not filled computed by `EXTRA_INPUTS`. Raises ValueError naming one that nothing fills."""
    missing = [name for name in needs if name not in graded.extras]
    unknown = [name for name in missing if name not in EXTRA_INPUTS]
    if unknown:
        raise ValueError(f"the recipe's advantage estimator needs the extra input(s) {unknown}, which this sampling "
                         f"mode does not fill; valid: the names of train/sample/extras.py's EXTRA_INPUTS "
                         f"({', '.join(EXTRA_INPUTS)}) or those its mode fills itself")
    if not missing:
        return graded
    filled = {name: np.asarray(EXTRA_INPUTS[name](graded, rollouts)) for name in missing}
    return dataclasses.replace(graded, extras={**graded.extras, **filled})
