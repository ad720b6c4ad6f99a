"""Child process for test_weight_check_vllm.py: the RL loop through a real vLLM server
whose weight export is deliberately wrong (layer 5's down_proj written as zeros). Prints
one JSON line with what happened; the test then resumes the run with the right export
through `jaxrl train --resume` (train_overrides gives both runs the same settings).

    python -m tests.rollout.wrong_weights_run SERVER_URL MODEL_DIR RUN_DIR
"""
import json
import sys
from pathlib import Path

import jax.numpy as jnp

from jaxrl_llm import rollout
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.checkpoint import Checkpointer
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.run.step_failure import StepFailed

REPO = Path(__file__).resolve().parents[2]
RIGHT_EXPORT = rollout.bridge_export


def wrong_export(cfg, dtype="float32"):
    export = RIGHT_EXPORT(cfg, dtype)

    def write(params, directory):
        down = jnp.asarray(params["layers"]["down_proj"])
        export({**params, "layers": {**params["layers"], "down_proj": down.at[5].set(0.0)}}, directory)

    return write


CONFIG = REPO / "experiments/demo.py"


def train_overrides(url: str, model_dir: str, run_dir: str) -> list[str]:
    """Two steps of 2 prompts x 4 samples of 8 tokens, one micro-batch, no periodic checkpoints."""
    return ["total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{url}]", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4", "rollout.max_tokens=8", "train.micro_batch_size=8",
            "checkpoint.every_steps=0", "checkpoint.async_save=false", "metrics.tensorboard=false",
            f"run_dir={run_dir}", f"model.source={model_dir}"]


def main(url: str, model_dir: str, run_dir: str) -> None:
    cfg = load_config(str(CONFIG), train_overrides(url, model_dir, run_dir))
    rollout.bridge_export = wrong_export
    try:
        loop.train(cfg)
        error = None
    except StepFailed as err:
        error = str(err)
    finally:
        rollout.bridge_export = RIGHT_EXPORT
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=3) as ckpt:
        saved = ckpt.all_steps()
    print(json.dumps({"error": error, "checkpoints_after_failure": saved}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
