"""A mixture-of-experts policy trained with routing replay (R3, arXiv 2510.11370; docs/architecture.md,
"Routing replay in the learner"), CPU-sized.

No MoE weights ship offline, so the policy is a tiny random Qwen3-MoE (2 layers, width 32, 4 experts
of width 32 per layer, top-2 with renormalised gates, SmolLM2's tokenizer), written once as an HF
directory under the cache (`tiny_qwen3_moe_dir`, from PRNGKey(0); `model.source=DIR` for a real
one). The JAX sampler records the experts every token was routed to (rollout.return_routed_experts)
and the learner's pi_old and gradient passes replay them (train.routing_replay=sampler);
metrics.jsonl carries `routing/differs_frac` (the share of completion tokens whose learner top-k
differs from the sampler's), `routing/mismatch_k3_replay_sampler` and the router metrics.

The prompts are 1-digit additions; a random policy never answers them, so the reward here is
`word_starts` (spaces in the completion over its 12-token budget): a random policy's groups vary in
it from the first step, so the routers get gradients:

    jaxrl train --config experiments/moe_routing_replay.py
    jaxrl train --config experiments/moe_routing_replay.py train.routing_replay=off   # the learner's own router
"""
from __future__ import annotations

import os

from jaxrl_llm.train.config import (CheckpointConfig, Config, MetricsConfig, ModelConfig, RecipeConfig, RolloutConfig,
                                    TaskConfig, TrainConfig)

MODULE = "experiments.moe_routing_replay"  # the grader workers import the reward by this path (run from the root)
MAX_TOKENS = 12
MOE = dict(family="qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, norm_topk_prob=True)


def word_starts(completion: str, example) -> float:
    """Spaces in the completion (word starts) over MAX_TOKENS, capped at 1: about one half for a random policy."""
    return min(completion.count(" "), MAX_TOKENS) / MAX_TOKENS


def tiny_qwen3_moe_dir() -> str:
    """The tiny random Qwen3-MoE as an HF directory in the cache, written once (atomically)."""
    from jaxrl_llm import bridge

    out = os.path.join(bridge.default_cache_root(), "tiny-qwen3-moe-4x2-seed0")
    if os.path.isfile(os.path.join(out, "config.json")):
        return out
    import jax

    from jaxrl_llm.models import init_params
    from jaxrl_llm.models.config import tiny_decoder_config

    cfg = tiny_decoder_config(**MOE)
    return bridge.save_hf_dir(cfg, init_params(cfg, jax.random.key(0)), out, tokenizer_dir=bridge.smollm2_hf_dir())


def get_config() -> Config:
    return Config(
        name="moe_routing_replay",
        seed=0,
        run_dir="runs/moe_routing_replay",
        total_steps=10,
        model=ModelConfig(source=tiny_qwen3_moe_dir()),
        rollout=RolloutConfig(engine="jax", prompts_per_step=4, samples_per_prompt=8, max_tokens=MAX_TOKENS,
                              temperature=1.0, return_routed_experts=True),
        recipe=RecipeConfig(name="dr_grpo"),
        train=TrainConfig(lr=1e-3, warmup_steps=0, micro_batch_size=16, precision="fp32", grad_clip=1.0,
                          routing_replay="sampler"),
        task=TaskConfig(name="addition", digits=1, eval_size=16, eval_samples=4, reward_fn=f"{MODULE}:word_starts"),
        checkpoint=CheckpointConfig(every_steps=0, keep=1),
        metrics=MetricsConfig(tensorboard=False, progress_every=1),
    )
