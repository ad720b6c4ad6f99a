"""Learner step throughput of SmolLM2-135M with a KL-to-reference term, with the PPO
critic and with VinePPO's Monte-Carlo values, relative to a plain GRPO step on the same
batch.

    python -m jaxrl_llm.benchmarks.cpu.objectives [--batch 16] [--prompt 32] [--completion 32]
                                              [--warmup 1] [--iters 3] [--precision fp32] [--tiny]

One learner step as the loop runs it (`train/learn/step.py`): the pi_old pass
(`Learner.step_logprobs`, plus reference log-probs / critic values when the recipe
needs them), `core.prepare_step_batch`, one optimiser update. Configurations:

  grpo       GRPO, no KL                               (the baseline)
  grpo_kl    GRPO + k3 KL to the reference, beta 0.04  (one more forward per micro-batch)
  ppo        PPO with the value head critic + GAE      (the head rides the same forward)
  vineppo    VinePPO: the step's Monte-Carlo values    (K = --vine-k continuations of every
             (`train/vineppo_step.estimate`: one JAX-  chunk start, every --vine-chunk tokens,
             sampler call, graded) + the learner step  sampled to the end of the budget)

The batch's own rollouts are common to every configuration and not timed; VinePPO's
extra sampling is, since it is part of its step.

The configurations take turns every round (`interleaved_times`), so drifting load on a
shared machine hits all alike; the report gives the median seconds per step, tokens/s
(prompt + completion tokens of the batch) and the ratio to grpo.

``--tiny`` (``make bench-objectives BENCH_ARGS=--tiny``, the tests): a random 2-layer decoder over
SmolLM2's tokenizer (``addition_start.policy_from_scratch``), 4 sequences of 8 + 8 tokens, K = 2
continuations every 4 tokens, one timed step.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax

from jaxrl_llm import core
from jaxrl_llm.benchmarks.cpu.lora import synthetic_batch
from jaxrl_llm.benchmarks.common.timing import interleaved_times
from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord, SamplingParams
from jaxrl_llm.train.sample import vineppo_step
from jaxrl_llm.train.config import CriticConfig, TrainConfig
from jaxrl_llm.train.learn.step import _prepare
from jaxrl_llm.train.learn.learner import Learner

RECIPES = {"grpo": core.get_recipe("grpo"), "grpo_kl": core.get_recipe("grpo", kl_beta=0.04),
           "ppo": core.get_recipe("ppo"), "vineppo": core.get_recipe("vineppo")}


def batch_rollouts(seq, group: int) -> RolloutBatch:
    """The synthetic batch as the rollout engine would have returned it (every completion at
    full length, no EOS)."""
    p = seq.prompt_width
    records = tuple(RolloutRecord(i // group, i % group, seq.tokens[i, :p], seq.tokens[i, p:],
                                  seq.sampler_logp[i], "length", 0) for i in range(seq.tokens.shape[0]))
    return RolloutBatch(records, seq.tokens.shape[0] // group, group)


def vine_advantages(policy, seq, rewards, *, k: int, chunk: int, stats: dict):
    """() -> [N, T_c] VinePPO advantages of the batch: the loop's estimate through a JAX
    sampler that serves the policy, with a parity grader (constant time per answer)."""
    from jaxrl_llm.rollout.jax_sampler import JaxSampler

    engine = JaxSampler(policy.cfg, policy.params, eos_token_ids=policy.eos_token_ids, pad_id=policy.pad_id)
    rollouts = batch_rollouts(seq, rewards.shape[1])
    params = SamplingParams(temperature=1.0, max_tokens=seq.completion_mask.shape[1], seed=0)

    def run():
        out = vineppo_step.estimate(engine, rollouts, rewards, [None] * rewards.shape[0], k=k,
                                    rule=vineppo_step.ChunkRule(every=chunk), params=params,
                                    decode=lambda ids: policy.tokenizer.decode(list(ids)),
                                    grade=lambda texts, _: [float(len(t) % 2) for t in texts])
        stats.update(out.metrics)
        return out.advantages

    return run


def learner_step(cfg, params, recipe, seq, rewards, precision: str, advantages=None):
    train_cfg = dataclasses.replace(TrainConfig(), precision=precision, lr=1e-6, micro_batch_size=seq.tokens.shape[0])
    learner = Learner(cfg, recipe, train_cfg, total_steps=100, critic_cfg=CriticConfig())
    state = {"s": learner.init(params)}
    prepare = _prepare(recipe)

    def run():
        before = learner.step_logprobs(state["s"].params, seq, critic=state["s"].critic)
        extras = {} if advantages is None else {"advantages": advantages()}  # VinePPO's; no other extras here
        batch, _ = prepare(core.StepInputs(
            rewards, seq.completion_mask, before.logp, seq.sampler_logp, ref_logp=before.ref_logp,
            teacher_logp=before.teacher_logp, values=before.values, truncated=seq.truncated, correct=rewards,
            extras=extras))
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
    parser.add_argument("--vine-k", type=int, default=4)
    parser.add_argument("--vine-chunk", type=int, default=8)
    parser.add_argument("--only", default=",".join(RECIPES), help="comma-separated configurations (grpo always)")
    parser.add_argument("--tiny", action="store_true", help="a random 2-layer model, 4 x 16 tokens, one step")
    args = parser.parse_args(argv)
    if args.tiny:
        import tempfile

        from jaxrl_llm.benchmarks.common.addition_start import policy_from_scratch
        from jaxrl_llm.bridge import smollm2_hf_dir

        args.batch, args.prompt, args.completion, args.warmup, args.iters = 4, 8, 8, 0, 1
        args.vine_k, args.vine_chunk = 2, 4
        with tempfile.TemporaryDirectory() as folder:
            policy, model = policy_from_scratch(smollm2_hf_dir(), folder, 64, 2, 0), "tiny random decoder"
    else:
        from jaxrl_llm.train.policy import load_policy

        policy, model = load_policy("smollm2"), "SmolLM2-135M"
    cfg, params = policy.cfg, policy.params
    seq, rewards = synthetic_batch(cfg.vocab_size, args.batch // 4, 4, args.prompt, args.completion)
    steps, learners, vine_stats = {}, {}, {}
    chosen = {"grpo", *args.only.split(",")}
    for name, recipe in RECIPES.items():
        if name not in chosen:
            continue
        advantages = None
        if name == "vineppo":
            advantages = vine_advantages(policy, seq, rewards, k=args.vine_k, chunk=args.vine_chunk,
                                         stats=vine_stats)
        steps[name], learners[name] = learner_step(cfg, params, recipe, seq, rewards, args.precision, advantages)
    times = interleaved_times(steps, args.warmup, args.iters)
    tokens = seq.tokens.size
    base = statistics.median(times["grpo"])
    out = {}
    print(f"{model}, {args.batch} sequences x ({args.prompt} + {args.completion}) tokens, {args.precision}, "
          f"{jax.devices()[0].platform}")
    for name, t in times.items():
        median = statistics.median(t)
        out[name] = {"s_per_step": median, "tokens_per_s": tokens / median, "vs_grpo": base / median,
                     "reference_bytes": learners[name].reference_bytes}
        print(f"{name:8s} {median:7.2f} s/step  {tokens / median:8.1f} tokens/s  {base / median:5.2f}x grpo "
              f"throughput  reference {learners[name].reference_bytes / 2**20:.0f} MiB")
    if vine_stats:
        out["vineppo"].update(vine_stats)
        print(f"vineppo: K={args.vine_k}, a chunk every {args.vine_chunk} tokens: "
              f"{vine_stats['vineppo_prefixes']:.0f} prefixes, {vine_stats['vineppo_extra_tokens']:.0f} extra "
              f"tokens sampled per step ({vine_stats['vineppo_extra_tokens'] / tokens:.1f}x the batch's tokens)")
    return out


if __name__ == "__main__":
    main()
