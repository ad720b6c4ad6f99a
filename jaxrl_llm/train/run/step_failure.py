"""What the RL loop does when a step fails: keep the work done, and say how to go on.

A step can fail outside the learner: a vLLM server dies or becomes unreachable, the
producer thread raises, a weight push cannot be verified (train/sample/weight_check.py). The
learner state of the last finished step (for a failed push: of the step itself, whose
update is good but did not reach the servers) is written as a checkpoint, unless that
step is already on disk, and the loop stops with `StepFailed`, whose message names the
step, the cause, the checkpoint and --resume. A resumed run starts its engine from the checkpoint's
weights (pushing them to the servers again), so nothing is lost but the failed step.
"""
from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


class StepFailed(RuntimeError):
    """A step failed; the last finished step's learner state was checkpointed first."""


def checkpoint_then_fail(ckpt, *, failed_step: int, saved_step: int, checkpoint: dict, metadata: dict,
                         err: BaseException) -> StepFailed:
    """Writes `checkpoint` (the learner state after step `saved_step`) unless that step is on
    disk, and returns the StepFailed to raise from `err`. A failing save is logged, not
    raised: the original error is the one to report."""
    where = os.path.join(os.fspath(ckpt.directory), str(saved_step))
    try:
        if saved_step > 0:
            ckpt.save(saved_step, checkpoint, metadata=metadata, force=True)
            ckpt.wait()
        saved = (f"the learner state of step {saved_step} is checkpointed at {where}; fix the cause, then rerun "
                 "with --resume" if saved_step > 0 else
                 "no step had finished, so there is nothing to resume; fix the cause and start again")
    except Exception as save_err:  # e.g. donated buffers: report the original failure
        log.error("could not checkpoint step %d after the failure: %s", saved_step, save_err)
        saved = f"writing a checkpoint of step {saved_step} failed too ({save_err}); --resume uses the previous one"
    return StepFailed(f"step {failed_step} failed: {type(err).__name__}: {err}\n{saved}")
