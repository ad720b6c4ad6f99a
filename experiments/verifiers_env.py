"""A verifiers environment (task.name=verifiers, docs/environments.md) with SmolLM2-135M-Instruct, CPU-sized.

The environment is defined in this file, as a user brings one: ``load_environment`` returns a
verifiers (0.3, classic API) ``SingleTurnEnv`` over a data set made here ("Reverse the letters
of 'planet'."), scored by a ``Rubric`` of two weighted functions: the similarity of the reply
to the reversed word (difflib's ratio, weight 1) and a brevity term (weight 0.2).
``load_tool_environment`` is a ``ToolEnv`` on the same words with a Python ``reverse`` tool.
The config names the loader by module path (run from the repository root)::

    jaxrl train --config experiments/verifiers_env.py
    jaxrl train --config experiments/verifiers_env.py task.kwargs='{"env_id": "experiments.verifiers_env:load_tool_environment"}' task.max_turns=3
    jaxrl train --config experiments/verifiers_env.py task.kwargs='{"env_id": "vf-reverse-text"}'   # an installed env package

Episodes run turn by turn on the in-process JAX sampler (rollout.engine=vllm for the server).
Needs the verifiers extra (`make venv` installs it; else pip install -e '.[verifiers]').
"""
from difflib import SequenceMatcher

from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)

WORDS = ("planet", "garden", "silver", "window", "castle", "pencil", "rabbit", "forest", "bridge", "candle",
         "mirror", "orange", "pocket", "summer", "ticket", "violin", "wallet", "yellow", "anchor", "button")
SYSTEM = "Reverse the letters of the word you are given. Reply with the reversed word only."


def _dataset():
    from datasets import Dataset

    return Dataset.from_list([{"question": f"Reverse the letters of '{w}'.", "answer": w[::-1]} for w in WORDS])


def similarity(completion, answer) -> float:
    """difflib's ratio of the last reply (stripped) to the reversed word: 1.0 for an exact reply."""
    return SequenceMatcher(None, (completion[-1].content or "").strip(), answer).ratio()


def brevity(completion, answer) -> float:
    """1.0 for a reply no longer than the answer, down to 0 at four times its length."""
    extra = len((completion[-1].content or "").strip()) - len(answer)
    return max(0.0, 1.0 - max(extra, 0) / (3 * len(answer)))


def load_environment():
    import verifiers as vf

    return vf.SingleTurnEnv(dataset=_dataset(), system_prompt=SYSTEM,
                            rubric=vf.Rubric(funcs=[similarity, brevity], weights=[1.0, 0.2]))


def reverse(text: str) -> str:
    """Reverse a string.

    Args:
        text: The string to reverse.
    """
    return text[::-1]


def load_tool_environment(max_turns: int = 3):
    import verifiers as vf

    return vf.ToolEnv(dataset=_dataset(), system_prompt=SYSTEM + " You may use the reverse tool.", tools=[reverse],
                      max_turns=max_turns, rubric=vf.Rubric(funcs=[similarity]))


def get_config(env_id: str = "experiments.verifiers_env:load_environment") -> Config:
    return Config(
        name="verifiers_reverse",
        seed=0,
        run_dir="runs/verifiers_reverse",
        total_steps=10,
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=8,
                              max_tokens=64, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=5e-5, warmup_steps=0, micro_batch_size=4, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="verifiers", kwargs={"env_id": env_id}, max_turns=1, turn_max_tokens=16, eval_size=6,
                        eval_samples=4),
        checkpoint=CheckpointConfig(every_steps=0, keep=1),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )
