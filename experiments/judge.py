"""An LLM judge as the reward (task.judge, docs/judge.md), CPU-sized: SmolLM2-135M-Instruct learns
1-digit addition from the scores a frozen SmolLM2 judge gives its answers, no answer key used.

The judge runs on a second vLLM server that the run starts (the policy samples in process, on the
JAX sampler). Its few-shot rubric below asks for "Score: <0-10>"; an answer's reward is score / 10;
a judge answer without that format scores 0 and is counted (judge_malformed in metrics.jsonl).

    jaxrl train --config experiments/judge.py
    jaxrl train --config experiments/judge.py task.reward_fns='["judge", "addition"]' recipe.name=gdpo
    jaxrl train --config experiments/judge.py task.judge.server_urls='["http://127.0.0.1:8000"]'

The second line weights the judge with the exact grader (GDPO normalises each in its group); the
third scores on a judge server already running (its /v1/models names the model).
"""
from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)
from jaxrl_llm.train.config.judge import JudgeConfig

# A few-shot rubric: SmolLM2-135M-Instruct states "Score: N" after it more often than after a plain
# instruction (which it answers by solving the sum itself, docs/judge.md). A real judge would be a larger model.
RUBRIC = ("Grade answers with Score: <0-10>.\n\n"
          "Question: What is 1 + 1?\nAnswer: 2\nScore: 10\n\n"
          "Question: What is 1 + 2?\nAnswer: 5\nScore: 0\n\n"
          "Question: {prompt}\nAnswer: {response}")


def get_config() -> Config:
    return Config(
        name="judge",
        seed=0,
        run_dir="runs/judge",
        total_steps=10,
        model=ModelConfig(source="smollm2"),
        rollout=RolloutConfig(engine="jax", prompts_per_step=4, samples_per_prompt=8, max_tokens=12, temperature=1.0),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=2e-5, micro_batch_size=16, precision="fp32", grad_clip=1.0),
        task=TaskConfig(name="addition", digits=1, eval_size=0, eval_samples=4,
                        judge=JudgeConfig(model="smollm2", rubric=RUBRIC, score_format="Score: <0-10>",
                                          server_dtype="float32", max_model_len=1024, max_tokens=32)),
        checkpoint=CheckpointConfig(every_steps=0, keep=1),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )
