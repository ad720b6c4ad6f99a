"""Learner step throughput of SmolLM2-135M with a KL-to-reference term and with the PPO
critic, relative to a plain GRPO step on the same batch.

    python -m jaxrl_llm.benchmarks.objectives [--batch 16] [--prompt 32] [--completion 32]
                                              [--warmup 1] [--iters 3] [--precision fp32]

One learner step as the loop runs it (`train/learn.py`): the pi_old pass
(`Learner.step_logprobs`, plus reference log-probs / critic values when the recipe
needs them), `core.prepare_step_batch`, one optimiser update. Configurations:

  grpo       GRPO, no KL                               (the baseline)
  grpo_kl    GRPO + k3 KL to the reference, beta 0.04  (one more forward per micro-batch)
  ppo        PPO with the value head critic + GAE      (the head rides the same forward)

The configurations take turns every round (`interleaved_times`), so drifting load on a
shared machine hits all alike; the report gives the median seconds per step, tokens/s
(prompt + completion tokens of the batch) and the ratio to grpo.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax

from jaxrl_llm import core
from jaxrl_llm.benchmarks.lora import synthetic_batch
from jaxrl_llm.benchmarks.model import interleaved_times
from jaxrl_llm.train.config import CriticConfig, TrainConfig
from jaxrl_llm.train.learn import _prepare
from jaxrl_llm.train.learner import Learner

RECIPES = {"grpo": core.get_recipe("grpo"), "grpo_kl": core.get_recipe("grpo", kl_beta=0.04),
           "ppo": core.get_recipe("ppo")}


def learner_step(cfg, params, recipe, seq, rewards, precision: str):
    train_cfg = dataclasses.replace(TrainConfig(), precision=precision, lr=1e-6, micro_batch_size=seq.tokens.shape[0])
    learner = Learner(cfg, recipe, train_cfg, total_steps=100, critic_cfg=CriticConfig())
    state = {"s": learner.init(params)}
    prepare = _prepare(recipe)

    def run():
        before = learner.step_logprobs(state["s"].params, seq, critic=state["s"].critic)
        batch, _ = prepare(rewards, seq.completion_mask, before.logp, seq.sampler_logp, seq.truncated,
                           before.ref_logp, before.values)
        state["s"], metrics = learner.update(state["s"], seq, batch)
        jax.block_until_ready(state["s"].params)

    return run, learner


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args(argv)
    from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir

    cfg, params = load_hf_dir(smollm2_hf_dir(), dtype="float32")
    seq, rewards = synthetic_batch(cfg.vocab_size, args.batch // 4, 4, args.prompt, args.completion)
    steps, learners = {}, {}
    for name, recipe in RECIPES.items():
        steps[name], learners[name] = learner_step(cfg, params, recipe, seq, rewards, args.precision)
    times = interleaved_times(steps, args.warmup, args.iters)
    tokens = seq.tokens.size
    base = statistics.median(times["grpo"])
    out = {}
    print(f"SmolLM2-135M, {args.batch} sequences x ({args.prompt} + {args.completion}) tokens, {args.precision}, "
          f"{jax.devices()[0].platform}")
    for name, t in times.items():
        median = statistics.median(t)
        out[name] = {"s_per_step": median, "tokens_per_s": tokens / median, "vs_grpo": base / median,
                     "reference_bytes": learners[name].reference_bytes}
        print(f"{name:8s} {median:7.2f} s/step  {tokens / median:8.1f} tokens/s  {base / median:5.2f}x grpo "
              f"throughput  reference {learners[name].reference_bytes / 2**20:.0f} MiB")
    return out


if __name__ == "__main__":
    main()
