"""`jaxrl` as a user runs it: a user error is one line naming the problem, exit status 2,
no traceback (unless --debug)."""
import sys
from pathlib import Path

import pytest

from tests.one_line_errors import REPO, jaxrl, one_line_error

ONE_DEVICE = {"XLA_FLAGS": "--xla_force_host_platform_device_count=1"}  # as on a 1-CPU/GPU machine


@pytest.mark.parametrize("args, names", [
    (["train", "--config", "experiments/demo.py", "train.lrr=1e-5"], ["train.lrr", "did you mean 'lr'"]),
    (["train", "--config", "experiments/no_such_experiment.py"], ["experiments/no_such_experiment.py", "does not exist"]),
    (["train", "--config", "experiments/demo.py", "recipe.advantage=gae"], ["recipe.advantage = 'gae'", "critic"]),
    (["train", "--config", "experiments/demo.py", "recipe.kl_beta=-0.1"], ["recipe.kl_beta"]),
    (["train", "--config", "experiments/demo.py", "recipe.sapo_tau_pos=2.0"],
     ["recipe.sapo_tau_pos = 2.0", "policy loss 'ppo_clip' has no 'tau_pos'", "recipe.loss in ['sapo']"]),
    (["train", "--config", "experiments/demo.py", "recipe.name=opd"], ["recipe.name = 'opd'", "distill.teacher"]),
    (["train", "--config", "experiments/demo.py", "rollout.max_tokens=-3"], ["rollout.max_tokens", ">= 1"]),
    (["train", "--config", "experiments/demo.py", "rollout.engine=vlm"], ["rollout.engine", "did you mean 'vllm'"]),
    (["train", "--config", "experiments/demo.py", "task.name=jsonl"], ["task.jsonl_path"]),
    (["train", "--config", "experiments/demo.py", "task.reward_fn=no_such_rewards:score"],
     ["task.reward_fn = 'no_such_rewards:score'", "cannot import module 'no_such_rewards'"]),
    (["eval", "--config", "experiments/demo.py", "--step", "last"], ["--step 'last'", "'latest'"]),
    (["train"], ["--config"]),
    (["train", "--config", "experiments/demo.py", "train.reuse_sampler_logprobs=true"],
     ["train.reuse_sampler_logprobs = true", "rollout.batch_invariant=true"]),
    (["train", "--config", "experiments/demo.py", "rollout.batch_invariant=true", "rollout.engine=vllm"],
     ["rollout.batch_invariant = true", "rollout.engine = 'vllm'", "engine=jax"]),
    # issue 48: the off-policy corrections, DPPO's two radii and Tang et al.'s pass@k where they cannot apply
    (["train", "--config", "experiments/demo.py", "recipe.correction=decoupled_ppo", "rollout.engine=jax",
      "rollout.batch_invariant=true", "train.reuse_sampler_logprobs=true"],
     ["recipe.correction = 'decoupled_ppo'", "train.reuse_sampler_logprobs = true", "reuse_sampler_logprobs=false"]),
    (["train", "--config", "experiments/demo.py", "recipe.correction=seq_mask_tis", "rollout.engine=jax",
      "rollout.batch_invariant=true", "train.reuse_sampler_logprobs=true"], ["recipe.correction = 'seq_mask_tis'"]),
    (["train", "--config", "experiments/demo.py", "recipe.dppo_threshold_low=0.1"],
     ["recipe.dppo_threshold_low = 0.1", "'ppo_clip' has no 'threshold_low'", "recipe.loss in ['dppo_tv', 'dppo_kl']"]),
    (["train", "--config", "experiments/demo.py", "recipe.correction=seq_mask_tis", "recipe.correction_low=1.01",
      "recipe.correction_high=1.0"], ["recipe.correction_low = 1.01 > recipe.correction_high = 1.0",
                                      "0 < correction_low <= correction_high"]),
    (["train", "--config", "experiments/demo.py", "recipe.correction=token_tis", "recipe.correction_low=0.5"],
     ["recipe.correction_low = 0.5", "'token_tis' has no 'low'", "'seq_mask_tis'"]),
    (["train", "--config", "experiments/demo.py", "recipe.correction=seq_mask_tis", "recipe.correction_cap=3"],
     ["recipe.correction_cap = 3.0", "'seq_mask_tis' has no 'cap'", "'decoupled_ppo'"]),
    (["train", "--config", "experiments/demo.py", "recipe.correction=geometric_sequence_rejection"],
     ["recipe.correction = 'geometric_sequence_rejection'", "recipe.correction_low and recipe.correction_high"]),
    (["train", "--config", "experiments/demo.py", "recipe.advantage=grpo_passk", "rollout.samples_per_prompt=1"],
     ["recipe.advantage = 'grpo_passk'", "rollout.samples_per_prompt = 1", "samples_per_prompt >= 2"]),
    # issue 49: routing replay
    (["train", "--config", "experiments/demo.py", "train.routing_replay=on"],
     ["train.routing_replay = 'on'", "valid: one of 'off', 'sampler'"]),
    (["train", "--config", "experiments/demo.py", "train.routing_replay=sampler", "rollout.engine=vllm"],
     ["train.routing_replay = 'sampler'", "rollout.engine = 'vllm'", "rollout.return_routed_experts=true"]),
    (["train", "--config", "experiments/demo.py", "train.routing_replay=sampler", "rollout.engine=jax"],
     ["train.routing_replay = 'sampler'", "rollout.engine = 'jax'", "rollout.return_routed_experts=true"]),
    # issue 60: the JAX sampler's own mesh
    (["train", "--config", "experiments/demo.py", "rollout.engine=jax", "rollout.mesh.tensor=0"],
     ["rollout.mesh.tensor = 0", "valid: a positive axis size"]),
])
def test_user_errors_are_one_line_with_exit_status_2(args, names):
    one_line_error(jaxrl(*args), names)


def _unreadable_checkpoints(tmp_path: Path) -> list[str]:
    """A run directory whose only checkpoint has every data file truncated (a full disk)."""
    import numpy as np

    from jaxrl_llm.train.run.checkpoint import Checkpointer

    with Checkpointer(tmp_path / "run" / "checkpoints", every_steps=1, keep=2, async_save=False) as ckpt:
        ckpt.save(1, {"x": np.arange(3.0)}, force=True)
    files = [p for p in (tmp_path / "run" / "checkpoints" / "1" / "state").rglob("*") if p.is_file()]
    for path in files:
        path.write_bytes(b"")
    assert files
    return ["rollout.engine=jax", "--resume"]  # the option after the overrides


def _half_environment(tmp_path: Path) -> list[str]:
    """A module in the working directory with an environment class that has reset() but no step()."""
    (tmp_path / "half_env.py").write_text("class NoStep:\n    def reset(self, example):\n        return 'hi', {}\n")
    return ["task.env=half_env:NoStep"]


@pytest.mark.parametrize("setup, env, names", [
    (_unreadable_checkpoints, {}, ["--resume", "no checkpoint in", "can be restored", "step 1", "valid:"]),
    (lambda tmp_path: ["mesh.data=64", "rollout.engine=jax"], ONE_DEVICE,
     ["mesh.data=64", "the 1 devices", "valid:", "mesh.fsdp=-1"]),
    (lambda tmp_path: ["rollout.server_urls=http://127.0.0.1:1"], {},
     ["rollout.server_urls", "http://127.0.0.1:1", "does not answer", "valid:"]),
    (_half_environment, {}, ["task.env = 'half_env:NoStep'", "no step() method", "valid:"]),
    (lambda tmp_path: ["train.routing_replay=sampler", "rollout.engine=jax", "rollout.return_routed_experts=true"], {},
     ["train.routing_replay='sampler' needs a mixture-of-experts policy", "LlamaForCausalLM (dense)",
      "valid: train.routing_replay='off'"]),
    (lambda tmp_path: ["rollout.engine=jax", "rollout.mesh.tensor=2"], ONE_DEVICE,
     ["rollout.mesh: sampler mesh data=-1 x tensor=2", "does not divide the 1 devices", "valid:"]),
    # issue 60: mixture-of-experts options on a dense policy were ValueError tracebacks, exit 1
    (lambda tmp_path: ["rollout.engine=jax", "train.router_aux_loss_coef=0.01"], {},
     ["train.router_aux_loss_coef=0.01 needs a mixture-of-experts policy", "LlamaForCausalLM (dense)",
      "valid: train.router_aux_loss_coef=0.0"]),
    (lambda tmp_path: ["rollout.engine=jax", "rollout.return_routed_experts=true"], {},
     ["rollout.return_routed_experts=true needs a mixture-of-experts policy", "LlamaForCausalLM (dense)",
      "valid: rollout.return_routed_experts=false"]),
], ids=["resume-unreadable", "mesh-too-large", "server-not-listening", "env-without-step", "replay-dense-policy",
        "sampler-mesh-too-large", "aux-loss-dense-policy", "routed-experts-dense-policy"])
def test_refused_runs_are_one_line_with_exit_status_2(tmp_path, learning_model_dir, setup, env, names):
    """Refusals that were tracebacks (exit 1) or a silently different run (issues 35, 49, 60); each
    before any training step, with the tiny model so it costs seconds."""
    args = setup(tmp_path)
    one_line_error(jaxrl("train", "--config", str(REPO / "experiments/demo.py"), f"model.source={learning_model_dir}",
                         f"run_dir={tmp_path / 'run'}", *args, cwd=tmp_path, env=env), names)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # no step ran


def test_debug_shows_the_traceback():
    done = jaxrl("--debug", "train", "--config", "experiments/demo.py", "recipe.advantage=gae")
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "ConfigError" in done.stderr


def test_missing_model_source_is_a_user_error(tmp_path):
    one_line_error(jaxrl("train", "--config", "experiments/demo.py", f"model.source={tmp_path / 'missing'}",
                         f"run_dir={tmp_path / 'run'}"), ["model.source=", "no such directory"])


def test_the_working_directory_is_importable_for_plugins(tmp_path, monkeypatch):
    """`jaxrl` (a console script, whose sys.path lacks the working directory) can name the
    user's modules there: task.reward_fn="my_rewards:score" from the folder holding my_rewards.py."""
    from jaxrl_llm import cli
    from jaxrl_llm.data.plugins import load_object

    (tmp_path / "my_cwd_rewards.py").write_text("def score(completion, example):\n    return 1.0\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_cwd_rewards", raising=False)
    with pytest.raises(ImportError):
        __import__("my_cwd_rewards")
    cli._working_directory_importable()
    assert sys.path[-1] == str(tmp_path)
    assert load_object("my_cwd_rewards:score", what="task.reward_fn")("x", None) == 1.0
