"""A tiny RL setup on which the policy learns within a few steps, fast on CPU.

A random tiny decoder (2 layers, width 32) over SmolLM2's real tokenizer, its token
embeddings initialised 25x larger than `init_params` does (std 0.5) so that its next-token
distribution is peaked like a trained model's rather than uniform over 49152 tokens. The task
(`SpacesTask`) asks the addition task's prompts, but scores a completion by the share
of its tokens that begin a word: reward = (spaces in the text) / rollout.max_tokens.
The random policy scores ~0.6 with a spread inside almost every group, so the group-mean
advantages are non-zero, the parameters move at every step, and the reward climbs to
~1.0 within 4-5 steps at lr 1e-2 (with uniform embeddings it barely moves in 10 steps).

Tests that need a run which really learns (resume exactness, async equivalence, fault
injection, soak) use it in process (`learning_config` + `SpacesTask`; the fixtures `learning_model_dir` and
`learning_policy` are in tests/train/conftest.py) or as a child process that can be killed
(tests/train/kill_resume.py):

    python -m tests.train.learning_setup MODEL_DIR RUN_DIR [--resume] [dotted.overrides ...]

The child prints `step N` after each finished step and the final parameter digest.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import Task, make_task
from jaxrl_llm.rewards import trusted_in_process

REPO = Path(__file__).resolve().parents[2]
MAX_TOKENS = 6
EMBED_SCALE = 25.0  # std 0.02 -> 0.5: a peaked next-token distribution
LEARNING_OVERRIDES = ["rollout.engine=jax", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=8",
                      f"rollout.max_tokens={MAX_TOKENS}", "train.micro_batch_size=16", "train.lr=1e-2",
                      "train.precision=fp32", "checkpoint.async_save=false", "metrics.tensorboard=false",
                      "task.eval_size=4", "task.eval_samples=2", "metrics.progress_every=1"]


@trusted_in_process
def space_share(completion: str, example) -> float:
    """Share of the completion's (at most MAX_TOKENS) tokens that start a word."""
    return min(completion.count(" "), MAX_TOKENS) / MAX_TOKENS


def space_share_in_worker(completion: str, example) -> float:
    """`space_share` graded in worker processes (not marked trusted)."""
    return space_share(completion, example)


def dies_on_die(completion: str, example) -> float:
    """A grader whose process is killed (SIGKILL, as by the OOM killer) on the answer "die"."""
    if completion == "die":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)
    return space_share(completion, example)


class SpacesTask(Task):
    """The addition task's prompts, scored by `space_share` (or another module-level grader)."""

    name = "spaces"
    heldout_fraction = 0.3
    correct_threshold = 0.5

    def __init__(self, reward_fn=space_share):
        self._prompts = make_task("addition", digits=1)
        self.reward_fn = reward_fn

    def examples(self, split: str, n: int, *, seed: int, unique: bool = False):
        return self._prompts.examples(split, n, seed=seed, unique=unique)


def make_tiny_model_dir(out: Path, seed: int = 0) -> str:
    """A random 2-layer decoder over SmolLM2's vocabulary (init from PRNGKey(seed)), saved as an
    HF directory with SmolLM2's tokenizer files (prompts render and tokenise for real)."""
    import jax

    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config()
    params = init_params(cfg, jax.random.key(seed))
    params = {**params, "embed": params["embed"] * EMBED_SCALE}
    bridge.save_hf_dir(cfg, params, out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


def learning_config(model_dir: str, run_dir: Path, *extra: str):
    from jaxrl_llm.train.config import load_config

    return load_config(str(REPO / "experiments/demo.py"),
                       [*LEARNING_OVERRIDES, f"model.source={model_dir}", f"run_dir={run_dir}", *extra])


def flat_params(params) -> np.ndarray:
    """Every leaf of a params pytree, float64, concatenated in tree order."""
    import jax

    return np.concatenate([np.asarray(x, np.float64).reshape(-1) for x in jax.tree.leaves(params)])


def reference_sync_loop(cfg, policy, task):
    """The synchronous RL loop written out plainly, without the producer thread, the
    checkpointer or the metrics writer: per step, sample (seeded by the step), grade,
    learn, push the weights. Returns (per-step metrics, final float32 params)."""
    import contextlib

    import jax

    from jaxrl_llm.rewards import GraderPool
    from jaxrl_llm.train import distributed
    from jaxrl_llm.train.config.recipe import recipe_from_config
    from jaxrl_llm.train.sample.engines import engine_params, engine_spec, make_engine, sampling_params
    from jaxrl_llm.train.sample.grading import grade
    from jaxrl_llm.train.learn.step import learn
    from jaxrl_llm.train.policy import decode_completions, encode_prompts
    from jaxrl_llm.train.sample.prompts import step_examples, step_seed
    from jaxrl_llm.train.run.run_state import make_learner

    recipe = recipe_from_config(cfg)
    mesh = distributed.global_mesh(cfg.mesh) if jax.device_count() > 1 else None
    learner = make_learner(cfg, policy, recipe, mesh=mesh)
    state = learner.init(policy.params, seed=cfg.seed)
    group = cfg.rollout.samples_per_prompt
    rows = []
    with contextlib.ExitStack() as stack:
        spec = engine_spec(cfg)
        engine = make_engine(spec, policy, learner.full_params(state.params), stack=stack)
        pool = stack.enter_context(GraderPool(num_workers=1, timeout_s=cfg.task.reward_timeout_s))
        for step in range(1, cfg.total_steps + 1):
            examples = step_examples(task, step, seed=cfg.seed, prompts=cfg.rollout.prompts_per_step)
            rollouts = engine.generate(encode_prompts(policy, examples), group,
                                       sampling_params(cfg.rollout, seed=step_seed(cfg.seed, step)))
            graded = grade(pool, task, decode_completions(policy, rollouts), examples, group)
            state, metrics = learn(learner, state, rollouts, core.StepInputs(graded.rewards),
                                   completion_width=cfg.rollout.max_tokens)
            engine.update_weights(engine_params(spec, learner.full_params(state.params)))
            rows.append({"step": step, "reward": float(graded.rewards.mean()), **metrics})
    return rows, learner.full_params(state.params)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def child_command(model_dir: str, run_dir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "tests.train.learning_setup", model_dir, str(run_dir), *args]


def main(argv: list[str]) -> None:
    import logging

    from jaxrl_llm.train.run import loop

    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    model_dir, run_dir, *rest = argv
    resume = "--resume" in rest
    overrides = [a for a in rest if a != "--resume"]
    cfg = learning_config(model_dir, Path(run_dir), *overrides)
    out = loop.train(cfg, task=SpacesTask(), resume=resume)
    print(f"done step {out.step} ledger {out.ledger}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
