"""Verifying every weight push to vLLM servers, and what the loop does when one fails.

vLLM only logs a warning for a tensor it did not find in a reload, so a push that
silently left old or missing weights would go on sampling from the wrong policy. The
loop's DiskWeightSync therefore carries a `LogprobProbe` by default: after each reload,
one prompt-logprobs request per server scores a fixed token sequence, and the served
logprobs must match the learner's for the pushed params within a tolerance set by the
server dtype. Its cost is reported per step (`time_verify_s`, `weight_probe_diff`).

With `rollout.overlap_verify` the probe runs while the next batch is sampled (the engine
holds that batch back until it passes) and the loop waits for it after the step
(`wait_verified`, which costs no time there: sampling goes on meanwhile); its waiting
inside the generate is `time_verify_wait_s`.

A mismatch raises `WeightSyncError` in the publish (or in `wait_verified`); `keeping_state` hands the step's
learner state (good: only the servers are wrong) to the loop, which checkpoints it and
stops with `step_failure.StepFailed`, naming the step, the checkpoint and --resume (which
pushes the restored weights again at startup, verified the same way).
"""
from __future__ import annotations

import contextlib

import numpy as np

from jaxrl_llm.rollout.weight_sync import LogprobProbe, WeightSyncError
from jaxrl_llm.train.policy import Policy

# A fixed probe: ordinary text, long enough that a wrong layer shows on some token.
PROBE_TEXT = ("The quick brown fox jumps over the lazy dog. In 1969, two astronauts walked on the Moon; "
              "what is 7 + 5? The answer is 12.")
# Largest |served - learner| logprob per token. A float32 vLLM CPU server was measured up
# to 0.009 off the learner on this probe (SmolLM2, after one update; its kernels sum in
# another order); bfloat16/float16 weights move logprobs by up to a few tenths. A wrong
# or missing tensor moves them by far more (the test's zeroed layer: see its output).
PROBE_ATOL = {"float32": 0.05, "float16": 0.3, "bfloat16": 0.5}


def logprob_probe(policy: Policy, server_dtype: str) -> LogprobProbe:
    """The loop's default probe: PROBE_TEXT tokenised by the policy, scored by the learner's
    float32 forward (jitted once) at temperature 1."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm.models import token_logprobs

    ids = policy.tokenizer.encode(PROBE_TEXT, add_special_tokens=False).ids
    tokens = jnp.asarray([ids], jnp.int32)
    score = jax.jit(lambda params: token_logprobs(params, policy.cfg, tokens)[0])
    return LogprobProbe(token_ids=list(ids), learner_logprobs=lambda params: np.asarray(score(params)),
                        atol=PROBE_ATOL[server_dtype])


def push_metrics(engine) -> dict[str, float]:
    """The last push's verification cost and worst probe difference (vLLM engines only)."""
    report = getattr(engine, "last_sync", None)
    if report is None or report.probe_max_abs_diff is None:
        return {}
    return {"time_verify_s": float(report.verify_s), "weight_probe_diff": float(report.probe_max_abs_diff)}


def wait_verified(engine) -> dict[str, float]:
    """For an engine that verifies pushes in the background (`overlap_verify`): wait for the
    newest push's probe, raising its WeightSyncError, and return its metrics; {} otherwise."""
    if not getattr(engine, "overlap_verify", False):
        return {}
    report = engine.wait_verified()
    metrics = {"time_verify_wait_s": float(engine.last_verify_wait_s)}
    if report is not None and report.probe_max_abs_diff is not None:
        metrics.update(time_verify_s=float(report.verify_s), weight_probe_diff=float(report.probe_max_abs_diff))
    return metrics


class PushFailedWithState(Exception):
    """Carries the learner state of a step whose weight push failed, up to the loop, and the
    weight version that push installed (None: the push did not advance the engine's version)."""

    def __init__(self, state, error: BaseException, version: int | None = None):
        super().__init__(str(error))
        self.state, self.error, self.version = state, error, version


@contextlib.contextmanager
def keeping_state(state, version: int | None = None):
    """Around a publish (or the wait for its verification, then with the `version` it
    installed): a `WeightSyncError` comes out with the step's learner `state` attached."""
    try:
        yield
    except WeightSyncError as err:
        raise PushFailedWithState(state, err, version) from err
