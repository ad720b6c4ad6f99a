"""A GEM game (task.name=gem, docs/environments.md) with SmolLM2-135M-Instruct, CPU-sized.

GEM's GuessTheNumber-easy: a secret from 1 to 10, four guesses written as \\boxed{N}, GEM's
"higher"/"lower" hints in between; GEM's rewards (1.0 for the secret, -0.1 for a reply without
a \\boxed{} number, which ends the episode). Episodes run turn by turn on the in-process JAX
sampler (rollout.engine=vllm for the server); the optional ":ENV_ID" picks another GEM id:

    jaxrl train --config experiments/gem_game.py
    jaxrl train --config experiments/gem_game.py:game:Mastermind-v0-easy task.max_turns=10
    jaxrl train --config experiments/gem_game.py task.kwargs='{"env_id": "rg:leg_counting", "tools": ["python"]}'

Needs the gem extra (`make venv` installs it; else pip install -e '.[gem]' && pip install
--no-deps gem-llm==0.1.0).
"""
from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)


def get_config(env_id: str = "game:GuessTheNumber-v0-easy") -> Config:
    slug = env_id.replace(":", "_").lower()
    return Config(
        name=f"gem_{slug}",
        seed=0,
        run_dir=f"runs/gem_{slug}",
        total_steps=10,
        model=ModelConfig(source="smollm2"),
        # the first message (GEM's instructions) is ~150 tokens; a turn is a short guess plus a ~30-token hint
        rollout=RolloutConfig(engine="jax", server_dtype="float32", prompts_per_step=4, samples_per_prompt=8,
                              max_tokens=192, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=5e-5, warmup_steps=0, micro_batch_size=4, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="gem", kwargs={"env_id": env_id}, max_turns=4, turn_max_tokens=16, eval_size=8,
                        eval_samples=4),
        checkpoint=CheckpointConfig(every_steps=0, keep=1),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )
