"""Bring your own reward and data: a reward function defined in this file, grading a CSV file.

The task: "How many letters are in the word 'banana'?" for the 32 words of
experiments/data/letter_counts.csv (read with HF datasets; columns word, question, letters).
The reward, `letter_count_reward` below, gives partial credit: 1.0 for the right count,
0.5 for a count off by one, 0.0 otherwise. Nothing in the library is edited: the config names
the file (`task.data_path`) and the function (`task.reward_fn="experiments.custom_reward:..."`),
which the grader worker processes import by that module path, so run from the repository root:

    jaxrl train --config experiments/custom_reward.py
    jaxrl train --config experiments/custom_reward.py rollout.engine=jax total_steps=4

A raising or hanging call of the reward scores 0 and is counted (reward_errors,
reward_timeouts in metrics.jsonl); the run goes on.
"""
from __future__ import annotations

from pathlib import Path

from jaxrl_llm.rewards import extract_integer_answer

# The name the grader workers import this file by (the repository root is importable).
MODULE = "experiments.custom_reward"
DATA = Path(__file__).resolve().parent / "data" / "letter_counts.csv"


# ---- The reward ----------------------------------------------------------------------------
def letter_count_reward(completion: str, example) -> float:
    """1.0 if the completion's number is the word's letter count, 0.5 if off by one, else 0.0.

    `example.answer` is the `letters` column as text; `example.metadata["word"]` the word.
    """
    answered = extract_integer_answer(completion)
    if answered is None:
        return 0.0
    return {0: 1.0, 1: 0.5}.get(abs(answered - int(example.answer)), 0.0)


# ---- The task section: data, grader, and what else the task takes ---------------------------
def data_fields() -> dict:
    """The questions: a local CSV file, question and answer columns named."""
    return {"data_path": str(DATA), "prompt_field": "question", "answer_field": "letters",
            "kwargs": {"instruction": " Answer with just the number."}}


def grader_fields() -> dict:
    """The grader: this file's reward function, run in 2 worker processes, 5 s per answer."""
    return {"reward_fn": f"{MODULE}:letter_count_reward", "reward_workers": 2, "reward_timeout_s": 5.0}


def task_section() -> dict:
    """The task section is the union of the parts above; a further part (a multi-turn
    environment) joins the union the same way."""
    return {**data_fields(), **grader_fields(), "eval_size": 0, "eval_samples": 4}


def get_config() -> dict:
    return {
        "name": "custom_reward",
        "run_dir": "runs/custom_reward",
        "total_steps": 20,
        "model": {"source": "smollm2"},
        "rollout": {"engine": "vllm", "server_dtype": "float32", "prompts_per_step": 8, "samples_per_prompt": 8,
                    "max_tokens": 12},
        "recipe": {"name": "dr_grpo"},
        "train": {"lr": 2e-5, "micro_batch_size": 16, "precision": "fp32"},
        "task": task_section(),
        "checkpoint": {"every_steps": 5, "keep": 2},
        "metrics": {"progress_every": 1},
    }
