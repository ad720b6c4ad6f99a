"""Example experiment: Dr. GRPO on 1-digit addition with SmolLM2-135M-Instruct.

1-digit addition is where this model has RL signal (pass@1 ~0.09, pass@8
~0.41 at temperature 1; docs/ENVIRONMENT.md). Run it, or a variant:

    jaxrl train --config experiments/example_config.py
    jaxrl train --config experiments/example_config.py:grpo train.lr=2e-6

The optional ":ARG" picks the recipe, so GRPO and Dr. GRPO runs differ only
in the recipe and their names.
"""

from jaxrl_llm.train.config import (
    CheckpointConfig,
    Config,
    ModelConfig,
    RecipeConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
)


def get_config(recipe: str = "dr_grpo") -> Config:
    return Config(
        name=f"{recipe}_add1",
        seed=0,
        run_dir=f"runs/{recipe}_add1",
        total_steps=200,
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(
            engine="vllm",
            prompts_per_step=16,
            samples_per_prompt=8,
            max_tokens=32,
            temperature=1.0,  # top_p=1, top_k off: the learner sees the sampler's support
        ),
        # Dr. GRPO's constant-length aggregation uses L_const = max_tokens.
        recipe=RecipeConfig(name=recipe),
        train=TrainConfig(lr=1e-6, warmup_steps=10, micro_batch_size=16, precision="bf16"),
        task=TaskConfig(name="addition", digits=1, eval_size=100),
        checkpoint=CheckpointConfig(every_steps=50, keep=2),
    )
