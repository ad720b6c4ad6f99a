"""The frozen teacher of on-policy distillation (`distill.teacher`; core/distill.py).

The teacher is loaded once, float32, from one of:
  * "smollm2", an HF directory or a .gguf file, as `model.source` is (train/policy.py);
    any architecture the bridge loads (e.g. a larger model of the same family);
  * a run directory (it holds run_info.json): its latest checkpoint, on the base model
    its config names (LoRA adapters merged), e.g. a run that learned the task.
It must share the student's tokenizer (the same token -> id map and EOS), since it
scores the student's token ids; anything else is refused, naming distill.teacher.

The learner keeps only a compute-dtype copy (`SidePasses.teacher_params`, train/learn/side_passes.py), placed like the
policy's params, and runs it in the pi_old pass. On --resume the teacher is loaded again
from the same source, so it is the same weights, bit for bit, without being checkpointed.
"""
from __future__ import annotations

import os
from typing import Any, NamedTuple

from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.train.config.distill import TEACHER_HELP
from jaxrl_llm.train.run.provenance import RUN_INFO_FILE, read_run_info
from jaxrl_llm.train.policy import Policy, load_policy
from jaxrl_llm.utils.typed_config import ConfigError


class Teacher(NamedTuple):
    cfg: DecoderConfig
    params: Any  # float32
    source: str
    step: int | None  # the checkpoint's step for a run directory, else None


def load_teacher(source: str, student: Policy) -> Teacher:
    """The teacher of `source` (see the module doc), checked against the student's tokenizer."""
    if os.path.isdir(source) and os.path.isfile(os.path.join(source, RUN_INFO_FILE)):
        policy, step, params = _from_run(source)
    else:
        try:
            policy = load_policy(source)
        except (FileNotFoundError, ValueError) as err:
            raise ConfigError(f"distill.teacher = {source!r}: {err}; valid: {TEACHER_HELP}") from None
        step, params = None, policy.params
    check_same_tokenizer(source, policy, student)
    return Teacher(policy.cfg, params, source, step)


def _from_run(run_dir: str) -> tuple[Policy, int, Any]:
    """(the run's base policy, its latest checkpoint's step, that checkpoint's float32 params)."""
    from jaxrl_llm.train.config import config_from_dict, replace_values
    from jaxrl_llm.train.run.run_state import restore_params

    info = read_run_info(run_dir) or {}
    if not info.get("config"):
        raise ConfigError(f"distill.teacher = {run_dir!r}: its {RUN_INFO_FILE} holds no config; valid: {TEACHER_HELP}")
    cfg = config_from_dict(info["config"])
    if cfg.checkpoint.dir is None:  # the run may have been moved: its checkpoints are under run_dir
        cfg = replace_values(cfg, {"run_dir": run_dir})
    policy = load_policy(cfg.model.source)
    try:
        step, params = restore_params(cfg, policy)
    except FileNotFoundError as err:
        raise ConfigError(f"distill.teacher = {run_dir!r}: {err}") from None
    return policy, step, params


def check_same_tokenizer(source: str, teacher: Policy, student: Policy) -> None:
    """Refuses a teacher whose token -> id map or EOS differs from the student's."""
    theirs, ours = teacher.tokenizer.get_vocab(), student.tokenizer.get_vocab()
    if theirs != ours or teacher.eos_token_ids != student.eos_token_ids:
        differ = sorted(t for t in set(theirs) | set(ours) if theirs.get(t) != ours.get(t))
        raise ConfigError(
            f"distill.teacher = {source!r} has another tokenizer than model.source ({len(theirs)} vs {len(ours)} "
            f"tokens, {len(differ)} differ, e.g. {differ[:3]}; EOS {teacher.eos_token_ids} vs "
            f"{student.eos_token_ids}); valid: a teacher with the student's tokenizer")
    if teacher.cfg.vocab_size < len(ours):
        raise ConfigError(f"distill.teacher = {source!r} has {teacher.cfg.vocab_size} embedding rows for the "
                          f"tokenizer's {len(ours)} tokens; valid: a teacher model over the student's vocabulary")
