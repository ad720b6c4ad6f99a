"""The settings the experiments share: SmolLM2 on 1-digit addition on a CPU, and its
GPU-scale form. Experiment files import this module as a sibling
(`from base_configs import addition_config`); `load_config` and `python
experiments/<name>.py` both put experiments/ on sys.path.
"""
from __future__ import annotations

from jaxrl_llm.train.config import Config, ConfigError, config_from_dict, replace_values


def addition_config(name: str, scale: str = "", *, recipe: str, total_steps: int, max_tokens: int,
                    precision: str = "fp32", seed: int = 0) -> Config:
    """The CPU setting the experiments share: SmolLM2-135M-Instruct (float32 master
    weights) on 1-digit addition, the JAX sampler at temperature 1 (and at the learner's
    precision), 8 prompts x 8 samples, lr 2e-5, a checkpoint every 2 steps.
    scale = "gpu" gives its `gpu_scale` form."""
    if scale not in ("", "gpu"):
        raise ConfigError(f"{name}: scale {scale!r} is invalid; valid: none or 'gpu'")
    cfg = config_from_dict({
        "name": name, "seed": seed, "total_steps": total_steps,
        "model": {"source": "smollm2"},
        "rollout": {"engine": "jax", "prompts_per_step": 8, "samples_per_prompt": 8, "max_tokens": max_tokens,
                    "temperature": 1.0},
        "recipe": {"name": recipe},  # dr_grpo's L_const = rollout.max_tokens
        "train": {"lr": 2e-5, "warmup_steps": 0, "micro_batch_size": 16, "precision": precision, "grad_clip": 1.0},
        "task": {"name": "addition", "digits": 1, "eval_size": 0},
        "checkpoint": {"every_steps": 2, "keep": 1, "async_save": False},
        "metrics": {"tensorboard": False, "progress_every": 1},
    })
    return gpu_scale(cfg, name=name) if scale == "gpu" else cfg


def gpu_scale(cfg: Config, *, name: str) -> Config:
    """The GPU-scale form of a CPU experiment config, for launch/single_node.py.

    The setting of Liu et al. 2025 (Dr. GRPO, arXiv 2503.20783): a 1.5B math
    model, MATH levels 3-5, 8 samples per prompt, ~3000 generated tokens, served
    by vLLM in bf16 on its own GPUs. model.source and task.jsonl_path are the
    user's: model.source=DIR (or single_node.py --model-dir) and task.jsonl_path=FILE;
    the run refuses to start without them, naming the field.
    """
    return replace_values(cfg, {
        "name": f"{name}_gpu", "total_steps": 400,
        "model.source": "Qwen/Qwen2.5-Math-1.5B",  # a local copy: model.source=DIR or single_node.py --model-dir
        "rollout.engine": "vllm", "rollout.prompts_per_step": 128, "rollout.samples_per_prompt": 8,
        "rollout.max_tokens": 3000, "rollout.server_dtype": "bfloat16",
        "train.lr": 1e-6, "train.warmup_steps": 0, "train.micro_batch_size": 8, "train.precision": "bf16",
        "train.minibatches_per_batch": 1, "train.remat": "full",
        "task.name": "jsonl", "task.eval_size": 500,  # MATH levels 3-5: task.jsonl_path=FILE
        "task.eval_samples": 4, "task.reward_workers": 8,
        "checkpoint.every_steps": 25, "metrics.progress_every": 1,
    })
