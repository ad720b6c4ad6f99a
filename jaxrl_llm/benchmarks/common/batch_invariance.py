"""What bitwise on-policy sampling costs (issue 37), side by side in one process, and whether it holds:

* the JAX sampler's tokens/s with and without ``batch_invariant`` (SmolLM2-135M, ``--batch`` prompts
  x ``--tokens`` new tokens, no stop token, so both draw the same tokens; after one untimed call each
  (the compile) the two take turns for ``--rounds`` timed calls; the load average is reported);
* the learner's pi_old pass that ``train.reuse_sampler_logprobs`` skips, next to one optimiser
  step (``Learner.update``), on the invariant sampler's batch (``--learner-batch`` sequences);
* `exactness` (used by the tests and by ``make gpu-check``): sampled log-probs against the learner's
  in several compositions of the batch (`compositions`), with the flag on and off.

Run: ``python -m jaxrl_llm.benchmarks.common.batch_invariance [--dtype float32] [--batch 64] [--tokens 256]
[--out FILE.json]``.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import NamedTuple

import jax
import numpy as np

from jaxrl_llm import bridge, core
from jaxrl_llm.benchmarks.common.results import git_commit
from jaxrl_llm.benchmarks.common.timing import interleaved_times
from jaxrl_llm.rollout.jax_sampler import JaxSampler
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train.learn.batch import build_sequences
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner

PRECISION = {"float32": "fp32", "bfloat16": "bf16"}


class Composition(NamedTuple):
    """One way the learner may be handed a sampled batch: the rows' order, padding and micro-batch."""
    name: str
    rollouts: RolloutBatch
    micro_batch_size: int
    completion_width: int
    prompt_bucket: int


def compositions(batch: RolloutBatch, max_tokens: int) -> list[Composition]:
    """All rows together; shuffled with wider padding and micro-batches of 5; each row alone."""
    n = len(batch.records)
    perm = np.random.RandomState(1).permutation(n)
    shuffled = dataclasses.replace(batch, records=tuple(dataclasses.replace(batch.records[i], prompt_index=j)
                                                        for j, i in enumerate(perm)))
    return [Composition("together", batch, n, max_tokens, 16),
            Composition("shuffled, wider padding, micro-batches of 5", shuffled, 5, max_tokens + 13, 48),
            Composition("each alone", batch, 1, max_tokens, 16)]


def sample(cfg, params, prompts, max_tokens: int, *, batch_invariant: bool, temperature: float,
           stop_ids=()) -> RolloutBatch:
    """The JAX sampler's batch for ``prompts`` (one sample each; EOS id 0 and ``stop_ids`` stop)."""
    sampler = JaxSampler(cfg, params, eos_token_ids=[0], batch_invariant=batch_invariant)
    return sampler.generate(prompts, n=1, params=SamplingParams(temperature=temperature, max_tokens=max_tokens,
                                                                seed=0, stop_token_ids=tuple(stop_ids)))


def differing_logprobs(cfg, params, composition: Composition, dtype: str, *, batch_invariant: bool,
                       temperature: float) -> int:
    """How many sampled tokens' log-probs differ between the sampler and the learner's pi_old pass
    (`Learner.step_logprobs`) over ``composition``."""
    learner = Learner(cfg, core.get_recipe("grpo"), TrainConfig(precision=PRECISION[dtype],
                                                                micro_batch_size=composition.micro_batch_size),
                      total_steps=1, temperature=temperature, batch_invariant=batch_invariant)
    seq = build_sequences(composition.rollouts, completion_width=composition.completion_width,
                          prompt_bucket=composition.prompt_bucket)
    pi_old = np.asarray(learner.step_logprobs(params, seq, with_reference=False).logp)
    return sum(int(np.sum(pi_old[j, :r.num_completion_tokens] != r.sampler_logprobs))
               for j, r in enumerate(composition.rollouts.records))


def exactness(cfg, params, prompts, max_tokens: int, dtypes=("bfloat16", "float32"),
              temperature: float = 0.7) -> dict:
    """For each dtype, batch_invariant on and off: tokens sampled and, per composition, how many of
    their log-probs differ from the learner's (on: must be 0 everywhere)."""
    out = {}
    for dtype in dtypes:
        typed = cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
        cast = jax.tree.map(lambda x: x.astype(dtype), params)
        for invariant in (True, False):
            batch = sample(typed, cast, prompts, max_tokens, batch_invariant=invariant, temperature=temperature)
            out[f"{dtype} batch_invariant={invariant}"] = {
                "tokens": sum(r.num_completion_tokens for r in batch.records),
                "differing": {c.name: differing_logprobs(typed, cast, c, dtype, batch_invariant=invariant,
                                                         temperature=temperature)
                              for c in compositions(batch, max_tokens)}}
    return out


def _timed(fn):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    return out, time.perf_counter() - start


def sampler_rates(cfg, params, prompts, tokens: int, rounds: int) -> dict[bool, tuple[list[float], RolloutBatch]]:
    """batch_invariant -> (tokens/s of each timed call, its batch): the two samplers take turns for
    ``rounds`` rounds after one untimed round (the compile), so both see the same load."""
    sampling = SamplingParams(temperature=1.0, max_tokens=tokens, seed=0)
    samplers = {invariant: JaxSampler(cfg, params, eos_token_ids=[cfg.vocab_size + 1], batch_invariant=invariant)
                for invariant in (False, True)}
    batches = {}

    def call(invariant):
        batches[invariant] = samplers[invariant].generate(prompts, n=1, params=sampling)

    times = interleaved_times({invariant: lambda i=invariant: call(i) for invariant in samplers}, 1, rounds)
    drawn = {i: sum(r.num_completion_tokens for r in batches[i].records) for i in samplers}
    assert drawn[True] == drawn[False] == len(prompts) * tokens, drawn  # the same tokens drawn (no stop id)
    return {i: ([drawn[i] / t for t in times[i]], batches[i]) for i in samplers}


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
    put = learner.place.replicated
    step_batch, _ = core.prepare_step_batch(learner.recipe, core.StepInputs(put(rewards), put(seq.completion_mask),
                                                                            before.logp, put(seq.sampler_logp)))
    for _ in range(2):
        _, update_seconds = _timed(lambda: learner.update(state, seq, step_batch))
    return pass_seconds, update_seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=sorted(PRECISION))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls of each sampler, taking turns")
    parser.add_argument("--learner-batch", type=int, default=16, help="0: skip the learner timing")
    parser.add_argument("--out", default=None, help="write the numbers to this JSON file")
    args = parser.parse_args(argv)
    cfg, params = bridge.load_hf_dir(bridge.smollm2_hf_dir())
    cfg = cfg.with_dtypes(param_dtype=args.dtype, compute_dtype=args.dtype)
    params = jax.tree.map(lambda x: x.astype(args.dtype), params)
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(100, 20000, size=rng.randint(8, 40))) for _ in range(args.batch)]
    load, commit = [os.getloadavg()[0]], git_commit()  # the code that runs (HEAD may move during the run)
    rates = sampler_rates(cfg, params, prompts, args.tokens, args.rounds)
    load.append(os.getloadavg()[0])
    slowdown = statistics.median(d / i for d, i in zip(rates[False][0], rates[True][0]))
    result = {"model": "SmolLM2-135M", "dtype": args.dtype, "batch": args.batch, "tokens": args.tokens,
              "backend": jax.default_backend(), "commit": commit, "host": platform.node(),
              "cpus": os.cpu_count(), "rounds": args.rounds,
              "sampler_tok_s": {"default": rates[False][0], "batch_invariant": rates[True][0]},
              "slowdown_median_of_rounds": slowdown}
    print(f"sampler, SmolLM2-135M {args.dtype}, {args.batch} x {args.tokens} tokens, {jax.default_backend()}, "
          f"{args.rounds} rounds taking turns: default {statistics.median(rates[False][0]):.1f} tok/s, "
          f"batch_invariant {statistics.median(rates[True][0]):.1f} tok/s (medians); slowdown per round "
          f"{', '.join(f'{d / i:.2f}x' for d, i in zip(rates[False][0], rates[True][0]))}, median {slowdown:.2f}x")
    if args.learner_batch:
        records = rates[True][1].records[:args.learner_batch - args.learner_batch % 2]
        batch = RolloutBatch(records=records, num_prompts=len(records), samples_per_prompt=1)
        pass_s, update_s = learner_times(cfg, params, batch, args.tokens, args.dtype)
        result["learner"] = {"sequences": len(records), "pi_old_pass_s": pass_s, "update_s": update_s,
                             "saved_fraction": pass_s / (pass_s + update_s)}
        print(f"learner, {len(records)} sequences: pi_old pass {pass_s:.2f} s, update {update_s:.2f} s; step with "
              f"recompute {pass_s + update_s:.2f} s, with reuse_sampler_logprobs {update_s:.2f} s "
              f"(saves {pass_s / (pass_s + update_s):.0%})")
    load.append(os.getloadavg()[0])
    result["load_1min"] = load
    print(f"load average (1 min) at start / after the sampler / at the end: {', '.join(f'{x:.1f}' for x in load)}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
