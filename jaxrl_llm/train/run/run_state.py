"""What a run's checkpoint holds (learner state, step, weight version, LoRA base), and
restoring a run's parameters for evaluation or export.

LoRA checkpoints hold the adapters and their optimiser state only; the metadata names
the base model they apply to (path + sha256), which resume, eval and export check.
"""
from __future__ import annotations

import dataclasses
import os

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.config.checks import check_policy_fields
from jaxrl_llm.train.plan import plan_run
from jaxrl_llm.train.learn.learner import Learner, LearnerState
from jaxrl_llm.train.policy import Policy


@dataclasses.dataclass(frozen=True)
class RunPosition:
    """Where a run stands: the last finished step, the rollout engine's weight version, and
    the checkpoint's metadata (e.g. the batches sampled ahead, `sampled_ahead`)."""

    step: int
    weight_version: int
    metadata: dict = dataclasses.field(default_factory=dict)


def checkpoint_state(state: LearnerState, step: int, version: int) -> dict:
    """The pytree orbax saves for one step."""
    return {"learner": state, "step": np.int64(step), "weight_version": np.int64(version)}


def position_of(restored_state: dict) -> RunPosition:
    return RunPosition(int(restored_state["step"]), int(restored_state["weight_version"]))


def make_learner(cfg: Config, policy: Policy, recipe: core.Recipe, *, mesh=None, teacher=None) -> Learner:
    """The run's learner of `recipe` (the run plan's, `plan.plan_run`); `teacher` (train.teacher.Teacher) the
    distillation teacher of a recipe that distils (only evaluation and export may leave it out)."""
    check_policy_fields(policy.cfg, train=cfg.train, rollout=cfg.rollout)  # before the engine: one line, exit 2
    return Learner(policy.cfg, recipe, cfg.train, total_steps=cfg.total_steps,
                   temperature=cfg.rollout.temperature, mesh=mesh, critic_cfg=cfg.critic, teacher=teacher,
                   batch_invariant=cfg.rollout.batch_invariant)


def restore_params(cfg: Config, policy: Policy, step: int | None = None):
    """(step, float32 params) of checkpoint `step` (latest when None) of the run `cfg` names."""
    learner = make_learner(cfg, policy, plan_run(cfg).recipe)
    target = checkpoint_state(learner.init(policy.params), 0, 0)
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=cfg.checkpoint.keep) as ckpt:
        restored = ckpt.restore(target, step=step) if step is not None else ckpt.restore_latest(target)
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {cfg.checkpoint_path}; valid: the run_dir of a run that "
                                "saved one (checkpoint.every_steps, or the end of a run)")
    check_lora_base(restored.metadata, learner, policy)
    return position_of(restored.state).step, learner.full_params(restored.state["learner"].params)


def lora_checkpoint_metadata(learner: Learner, policy: Policy) -> dict:
    """LoRA checkpoints hold adapters only; this names the base they apply to (path + sha256)."""
    if learner.lora is None:
        return {}
    from jaxrl_llm.models.lora import base_fingerprint

    return {"lora": {"rank": learner.lora.rank, "alpha": learner.lora.alpha, "targets": list(learner.lora.targets),
                     "base_model_dir": os.path.abspath(policy.model_dir),
                     "base_sha256": base_fingerprint(policy.model_dir)}}


def check_lora_base(metadata: dict, learner: Learner, policy: Policy) -> None:
    """An adapter checkpoint must be applied to the base it was trained on."""
    saved = (metadata or {}).get("lora")
    if learner.lora is None or saved is None:
        return
    current = lora_checkpoint_metadata(learner, policy)["lora"]
    if saved["base_sha256"] != current["base_sha256"]:
        raise ValueError(f"the LoRA checkpoint was trained on base {saved['base_model_dir']} (sha256 "
                         f"{saved['base_sha256'][:12]}...), but model.source gives {current['base_model_dir']} "
                         f"(sha256 {current['base_sha256'][:12]}...); valid: the same base weights")
