"""The main job (`make demo`): Dr. GRPO on SmolLM2-135M-Instruct, 1-digit addition.

The mission's architecture: rollouts from a vLLM server on 127.0.0.1, the learner's
weights pushed to it through the bridge (HF safetensors export + reload) after every
step. Sized for a 2-core CPU in under 10 minutes: 8 prompts x 8 samples per step,
completions of at most 12 tokens, a float32 learner and server. Held-out pass@1 is
measured on the 29 held-out questions before and after, by the same server.

    jaxrl demo                                        # = make demo
    jaxrl demo rollout.engine=jax                     # the in-process JAX sampler instead
    jaxrl train --config experiments/demo.py [dotted.overrides=...]
"""
from jaxrl_llm.train.config import (
    CheckpointConfig,
    Config,
    MetricsConfig,
    ModelConfig,
    RecipeConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
)


def get_config(recipe: str = "dr_grpo") -> Config:
    return Config(
        name=f"demo_{recipe}",
        seed=0,
        run_dir=f"runs/demo_{recipe}",
        total_steps=8,  # training reward reaches ~0.97 by step 7 at this learning rate
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(engine="vllm", server_dtype="float32", prompts_per_step=8, samples_per_prompt=8,
                              max_tokens=12, temperature=1.0),
        recipe=RecipeConfig(name=recipe),  # constant_length defaults to rollout.max_tokens
        train=TrainConfig(lr=2e-5, warmup_steps=0, micro_batch_size=16, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="addition", digits=1, eval_size=0, eval_samples=8),
        checkpoint=CheckpointConfig(every_steps=4, keep=2),
        metrics=MetricsConfig(tensorboard=True, progress_every=1),
    )
