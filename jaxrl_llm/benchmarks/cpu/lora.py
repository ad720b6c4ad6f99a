"""Learner memory and step time of SmolLM2-135M: full fine-tuning vs LoRA ranks.

    python -m jaxrl_llm.benchmarks.cpu.lora [--ranks 1,8,64] [--batch 4] [--prompt 32] [--completion 32]
                                        [--warmup 1] [--iters 3] [--tiny]

``--tiny`` (``make bench-lora BENCH_ARGS=--tiny``, the tests): a random 2-layer decoder
(``learner_gpu``'s "tiny" shape), rank 4, 4 sequences of 8 + 8 tokens, one timed step.

For full fine-tuning and each LoRA rank (all seven projections adapted), one
`Learner` (float32 compute: bf16 matmuls are slow on CPU) is built on the same
weights and the same synthetic GRPO step batch, and the report gives:

1. learner state bytes, computed from the pytrees: parameters (LoRA: the
   frozen float32 base + the adapters), optimiser state (AdamW: two moments
   per trainable value) and their sum, with the ratio to full fine-tuning;
2. XLA's temporary bytes of the compiled update step (activations, gradients,
   the merged weights) from the compiled memory analysis;
3. seconds per optimiser step (median), the configurations taking turns every
   round so that drifting load on a shared machine hits all alike, and the
   ratio to full fine-tuning measured in the same run.

The LoRA forward merges W + alpha/r * A @ B and differentiates through it, so
the backward still forms the full dL/dW = X^T dY per matrix before projecting
it onto A and B: LoRA saves optimiser work and state here, not backward FLOPs.
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.benchmarks.common.timing import interleaved_times
from jaxrl_llm.models import lora
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner


def synthetic_batch(vocab: int, groups: int, group_size: int, prompt: int, completion: int,
                    seed: int = 0) -> tuple[SequenceBatch, np.ndarray]:
    """Random tokens, full-length rows, 0/1 rewards with both values in every group."""
    rng = np.random.default_rng(seed)
    rows, width = groups * group_size, prompt + completion
    seq = SequenceBatch(tokens=rng.integers(0, vocab, (rows, width)).astype(np.int32),
                        attention_mask=np.ones((rows, width), np.int32),
                        positions=np.broadcast_to(np.arange(width, dtype=np.int32), (rows, width)).copy(),
                        completion_mask=np.ones((rows, completion), np.float32),
                        sampler_logp=np.zeros((rows, completion), np.float32),
                        truncated=np.zeros(rows, bool), prompt_width=prompt)
    rewards = (np.arange(rows).reshape(groups, group_size) % 2).astype(np.float32)
    return seq, rewards


class Setup:
    """One learner configuration: state, step batch, and its compiled update."""

    def __init__(self, name: str, cfg, params, seq: SequenceBatch, rewards: np.ndarray, rank: int):
        train_cfg = dataclasses.replace(TrainConfig(), precision="fp32", lr=1e-5, micro_batch_size=seq.tokens.shape[0],
                                        lora_rank=rank, lora_alpha=float(max(rank, 1)))
        self.name = name
        self.learner = Learner(cfg, core.get_recipe("grpo"), train_cfg, total_steps=100)
        self.state = self.learner.init(params)
        old_logp, _ = self.learner.logprobs(self.state.params, seq)
        self.step_batch, _ = core.prepare_step_batch(self.learner.recipe, core.StepInputs(
            jnp.asarray(rewards), jnp.asarray(seq.completion_mask), old_logp, jnp.asarray(seq.sampler_logp)))
        plan = self.learner.plan(seq)
        self.rows = self.learner.place.rows(plan)
        remat = "off" if self.learner.remat == "auto" else self.learner.remat
        lowered = self.learner._update.lower(self.state, self.learner.frozen, self.rows, self.step_batch,
                                             max_segments=plan.max_segments, remat=remat)
        self.compiled = lowered.compile()
        analysis = self.compiled.memory_analysis()
        self.temp_bytes = int(getattr(analysis, "temp_size_in_bytes", 0)) if analysis is not None else 0
        trainable = self.state.params
        self.trainable_values = int(sum(np.prod(x.shape) for x in jax.tree.leaves(trainable)))
        frozen = self.learner.frozen if self.learner.frozen is not None else {}
        self.param_bytes = lora.tree_bytes(trainable) + lora.tree_bytes(frozen)
        self.opt_bytes = lora.tree_bytes([x for x in jax.tree.leaves(self.state.opt_state) if np.ndim(x) > 0])

    def step(self) -> None:
        self.state, metrics = self.compiled(self.state, self.learner.frozen, self.rows, self.step_batch)
        jax.block_until_ready(metrics)


def _mib(n: int) -> str:
    return f"{n / 2 ** 20:9.1f} MiB"


def main(argv=None) -> dict[str, dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", default="1,8,64", help="comma-separated LoRA ranks")
    parser.add_argument("--groups", type=int, default=2, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=2, help="samples per prompt")
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a random 2-layer model, 4 x 16 tokens, one step")
    args = parser.parse_args(argv)
    if args.tiny:
        from jaxrl_llm.benchmarks.common.model_shapes import model_config
        from jaxrl_llm.models import init_params

        args.ranks, args.prompt, args.completion, args.warmup, args.iters = "4", 8, 8, 0, 1
        cfg = model_config("tiny", args.prompt + args.completion)
        params, model = init_params(cfg, jax.random.key(0), dtype="float32"), "tiny random decoder"
    else:
        from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir

        cfg, params = load_hf_dir(smollm2_hf_dir(), dtype="float32")
        params, model = jax.tree.map(jnp.asarray, params), "SmolLM2-135M"
    seq, rewards = synthetic_batch(cfg.vocab_size, args.groups, args.group_size, args.prompt, args.completion)
    ranks = [int(r) for r in args.ranks.split(",") if r.strip()]
    setups = [Setup("full", cfg, params, seq, rewards, 0)] + [Setup(f"lora r={r}", cfg, params, seq, rewards, r)
                                                             for r in ranks]
    rows = seq.tokens.shape[0]
    print(f"{model} float32, {jax.devices()[0].platform} x{jax.device_count()}: GRPO step of {rows} sequences x "
          f"{seq.tokens.shape[1]} tokens ({args.prompt} prompt + {args.completion} completion), AdamW, all seven "
          f"projections adapted, alpha = r")
    times = interleaved_times({s.name: s.step for s in setups}, args.warmup, args.iters)
    full = setups[0]
    full_time = statistics.median(times[full.name])
    header = (f"  {'config':<12} {'trainable':>12} {'params':>13} {'optimiser':>13} {'params+opt':>13} "
              f"{'vs full':>8} {'XLA temp':>13} {'s/step':>8} {'vs full':>8}")
    print(header)
    out = {}
    for s in setups:
        total = s.param_bytes + s.opt_bytes
        median = statistics.median(times[s.name])
        print(f"  {s.name:<12} {s.trainable_values:>12,} {_mib(s.param_bytes):>13} {_mib(s.opt_bytes):>13} "
              f"{_mib(total):>13} {total / (full.param_bytes + full.opt_bytes):>7.3f}x {_mib(s.temp_bytes):>13} "
              f"{median:>8.3f} {median / full_time:>7.2f}x")
        out[s.name] = {"trainable_values": s.trainable_values, "param_bytes": s.param_bytes, "opt_bytes": s.opt_bytes,
                       "temp_bytes": s.temp_bytes, "s_per_step": median, "vs_full": median / full_time}
    print("  step times (s, per round): " + "; ".join(
        f"{name}: {', '.join(f'{t:.2f}' for t in ts)}" for name, ts in times.items()))
    return out


if __name__ == "__main__":
    main()
