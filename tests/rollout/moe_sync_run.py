"""Child process for test_moe_vllm.py: two RL steps of a Qwen3-MoE policy through a real vLLM
CPU server serving it (full fine-tuning, one CPU device, as `jaxrl train` runs on a laptop).
The task is the addition prompts scored by the share of spaces (tests/train/learning_setup.py's
SpacesTask): a random model's samples spread over it, so step 1 really changes the weights that
the loop then pushes (export, reload, logprob probe) before step 2 samples from them.

    python -m tests.rollout.moe_sync_run SERVER_URL MODEL_DIR RUN_DIR [--zero-expert]

--zero-expert: the push writes layer 1's expert 3 as zeros (a broken export; the probe must
stop the run at step 1). Prints one JSON line: the error (None when the run finished) and the
largest change step 1 made to any weight.
"""
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import rollout
from jaxrl_llm.train.config import load_config
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run.step_failure import StepFailed
from tests.train.learning_setup import SpacesTask

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments/demo.py"
RIGHT_EXPORT = rollout.bridge_export


def zero_expert_export(cfg, dtype="float32"):
    """The sync export with layer 1's expert 3 (gate, up and down) written as zeros."""
    export = RIGHT_EXPORT(cfg, dtype)

    def write(params, directory):
        layers = {**params["layers"]}
        for name in ("expert_gate", "expert_up", "expert_down"):
            layers[name] = jnp.asarray(layers[name]).at[1, 3].set(0.0)
        export({**params, "layers": layers}, directory)

    return write


def overrides(url: str, model_dir: str, run_dir: str) -> list[str]:
    """2 steps of 2 prompts x 4 samples of 8 tokens, full fine-tuning at lr 1e-3, fp32."""
    return ["total_steps=2", "rollout.engine=vllm", f"rollout.server_urls=[{url}]", "rollout.prompts_per_step=2",
            "rollout.samples_per_prompt=4", "rollout.max_tokens=8", "train.micro_batch_size=8", "train.lr=1e-3",
            "train.lora_rank=0", "checkpoint.every_steps=0", "checkpoint.async_save=false",
            "metrics.tensorboard=false", "task.eval_size=0", "task.eval_every=0", f"run_dir={run_dir}",
            f"model.source={model_dir}"]


def largest_change(before, after) -> float:
    return max(float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))
               for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))


def main(url: str, model_dir: str, run_dir: str, *flags: str) -> None:
    from jaxrl_llm.train.policy import load_policy

    cfg = load_config(str(CONFIG), overrides(url, model_dir, run_dir))
    policy = load_policy(model_dir)
    if "--zero-expert" in flags:
        rollout.bridge_export = zero_expert_export
    error, change = None, None
    try:
        out = loop.train(cfg, task=SpacesTask(), policy=policy)
        change = largest_change(policy.params, out.params)
    except StepFailed as err:
        error = str(err)
    finally:
        rollout.bridge_export = RIGHT_EXPORT
    print(json.dumps({"error": error, "largest_weight_change": change}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
