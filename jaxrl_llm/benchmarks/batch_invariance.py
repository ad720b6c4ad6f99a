"""What bitwise on-policy sampling costs (issue 37), side by side in one process:

* the JAX sampler's tokens/s with and without ``batch_invariant`` (SmolLM2-135M, ``--batch`` prompts
  x ``--tokens`` new tokens, no stop token, the second call of each timed: the first compiles);
* the learner's pi_old pass that ``train.reuse_sampler_logprobs`` skips, next to one optimiser
  step (``Learner.update``), on the invariant sampler's batch (``--learner-batch`` sequences).

Run: ``python -m jaxrl_llm.benchmarks.batch_invariance [--dtype float32] [--batch 64] [--tokens 256]``.
"""
from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jaxrl_llm import bridge, core
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train.batch import build_sequences
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learner import Learner

PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


def _timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def sampler_rates(cfg, params, prompts, tokens: int) -> dict[bool, tuple[float, RolloutBatch]]:
    """batch_invariant -> (tokens/s of the second call, its batch)."""
    sampling = SamplingParams(temperature=1.0, max_tokens=tokens, seed=0)
    out = {}
    for invariant in (False, True):
        sampler = JaxSampler(cfg, params, eos_token_ids=[cfg.vocab_size + 1], batch_invariant=invariant)
        sampler.generate(prompts, n=1, params=sampling)  # compiles
        batch, seconds = _timed(lambda: sampler.generate(prompts, n=1, params=sampling))
        out[invariant] = (sum(r.num_completion_tokens for r in batch.records) / seconds, batch)
    return out


def learner_times(cfg, params, batch: RolloutBatch, tokens: int, dtype: str) -> tuple[float, float]:
    """(seconds of the invariant pi_old pass, seconds of one update), each its second call."""
    learner = Learner(cfg, core.get_recipe("grpo"), TrainConfig(precision=PRECISION[dtype], micro_batch_size=8),
                      total_steps=10, batch_invariant=True)
    state = learner.init(params)
    seq = build_sequences(batch, completion_width=tokens)
    for _ in range(2):
        before, pass_seconds = _timed(lambda: learner.step_logprobs(state.params, seq, with_reference=False))
    prompts = len(batch.records) // 2
    rewards = np.tile(np.array([[1.0, 0.0]], np.float32), (prompts, 1))
    step_batch, _ = core.prepare_step_batch(learner.recipe, learner.replicated(rewards),
                                            learner.replicated(seq.completion_mask), before.logp,
                                            learner.replicated(seq.sampler_logp))
    for _ in range(2):
        _, update_seconds = _timed(lambda: learner.update(state, seq, step_batch))
    return pass_seconds, update_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=sorted(PRECISION))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--learner-batch", type=int, default=16, help="0: skip the learner timing")
    args = parser.parse_args(argv)
    cfg, params = bridge.load_hf_dir(bridge.smollm2_hf_dir())
    cfg = cfg.with_dtypes(param_dtype=args.dtype, compute_dtype=args.dtype)
    params = jax.tree.map(lambda x: x.astype(args.dtype), params)
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(100, 20000, size=rng.randint(8, 40))) for _ in range(args.batch)]
    rates = sampler_rates(cfg, params, prompts, args.tokens)
    print(f"sampler, SmolLM2-135M {args.dtype}, {args.batch} x {args.tokens} tokens, {jax.default_backend()}: "
          f"default {rates[False][0]:.1f} tok/s, batch_invariant {rates[True][0]:.1f} tok/s, "
          f"slowdown {rates[False][0] / rates[True][0]:.2f}x")
    if args.learner_batch:
        records = rates[True][1].records[:args.learner_batch - args.learner_batch % 2]
        batch = RolloutBatch(records=records, num_prompts=len(records), samples_per_prompt=1)
        pass_s, update_s = learner_times(cfg, params, batch, args.tokens, args.dtype)
        print(f"learner, {len(records)} sequences: pi_old pass {pass_s:.2f} s, update {update_s:.2f} s; step with "
              f"recompute {pass_s + update_s:.2f} s, with reuse_sampler_logprobs {update_s:.2f} s "
              f"(saves {pass_s / (pass_s + update_s):.0%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
