"""The tiny RL runs of the train tests: a random 2-layer decoder over SmolLM2's real tokenizer
and chat template, the demo config shrunk to a few seconds a step, and the helpers that read
what a run wrote. The fixtures that build the models once per module are in
tests/train/conftest.py; this module holds the plain functions (importable by any test)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TINY_OVERRIDES = ["rollout.engine=jax", "total_steps=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
                  "rollout.max_tokens=6", "train.micro_batch_size=4", "train.lr=1e-3", "checkpoint.every_steps=1",
                  "checkpoint.async_save=false", "metrics.tensorboard=false", "task.eval_size=4",
                  "task.eval_samples=2"]
EOS_ID = 2  # SmolLM2's <|im_end|>


def make_plain_tiny_model_dir(out: Path) -> str:
    """A random 2-layer decoder over SmolLM2's 49152-token vocabulary (init from key 0), saved as
    an HF directory with SmolLM2's tokenizer files (so prompts render and tokenise for real)."""
    import jax

    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config()
    params = init_params(cfg, jax.random.key(0))
    bridge.save_hf_dir(cfg, params, out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


def make_stopping_model_dir(out: Path) -> str:
    """A random 2-layer decoder (SmolLM2's tokenizer) that stops early: every token
    embedding shares a direction u and the EOS row of the (untied) output layer points
    along u, so EOS gets a fixed logit of about 9.6 and answers end after ~4 tokens on
    average (1 to 12 seen), while the other 49151 tokens keep random logits near 0."""
    import jax
    import jax.numpy as jnp

    from jaxrl_llm import bridge
    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config(tie_word_embeddings=False)
    params = init_params(cfg, jax.random.key(0))
    u = jnp.ones(32) / jnp.sqrt(32.0)
    params["embed"] = params["embed"] + 5.0 * u
    params["lm_head"] = params["lm_head"].at[:, EOS_ID].set(1.7 * u)
    bridge.save_hf_dir(cfg, params, out, tokenizer_dir=bridge.smollm2_hf_dir())
    return str(out)


def tiny_config(model_dir: str, run_dir: Path, *extra: str):
    from jaxrl_llm.train.config import load_config

    return load_config(str(REPO / "experiments/demo.py"),
                       [*TINY_OVERRIDES, f"model.source={model_dir}", f"run_dir={run_dir}", *extra])


def tiny_run(model_dir: str, run_dir, *extra: str) -> list[dict]:
    """6 steps of 4 prompts x 8 samples at lr 1e-2 (long enough for a shaping method to show);
    returns the metrics rows."""
    from jaxrl_llm.train.run import loop
    from jaxrl_llm.train.run.metrics import read_metrics

    cfg = tiny_config(model_dir, run_dir, "total_steps=6", "rollout.prompts_per_step=4",
                      "rollout.samples_per_prompt=8", "train.micro_batch_size=16", "train.lr=1e-2",
                      "checkpoint.every_steps=0", *extra)
    loop.train(cfg)
    return read_metrics(cfg.run_path)


def late(rows: list[dict], key: str) -> float:
    """Mean of `key` over the second half of the run."""
    return float(np.nanmean([r[key] for r in rows[len(rows) // 2:]]))


def model_metrics(run_dir) -> list[dict]:
    """Per-step metrics without the wall-clock ones."""
    from jaxrl_llm.train.run import loop
    from jaxrl_llm.train.run.metrics import read_metrics

    return [{k: v for k, v in row.items() if k not in loop.TIMING_METRICS} for row in read_metrics(run_dir)]


def run_cli(*args: str) -> subprocess.Popen:
    """`python -m jaxrl_llm.cli ARGS` from the repository root, stdout and stderr together."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "jaxrl_llm.cli", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def raises_or_hangs(completion: str, example) -> float:
    """Module-level (importable by grader workers): raises on "boom", hangs on "hang"."""
    from tests.rewards import misbehaving_graders

    if completion == "hang":
        return misbehaving_graders.hangs_on_hang(completion, example)
    return misbehaving_graders.raises_on_boom(completion, example)
