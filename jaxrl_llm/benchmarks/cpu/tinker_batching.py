"""The Tinker server's batching of clients (`serve.tinker.learner.Learner.run`): N clients, each with
its own LoRA adapter, each sending one forward_backward of the same shape, run as one forward vs one
call at a time, in one run.

    python -m jaxrl_llm.benchmarks.cpu.tinker_batching [--model smollm2] [--clients 1 2 4] [--rounds 3]
                                                       [--datums 4] [--tokens 32] [--out FILE] [--tiny]

Each client: a rank-8 adapter on every projection and the LM head (the server's defaults, B drawn at
random), `--datums` datums of `--tokens` tokens, importance_sampling. Per N: "batched" is one
`Learner.run` of the N calls (what the server's worker runs when they are queued together), "alone"
is N `Learner.run` calls of one call each (what it ran before); the two take turns every round
(`common.timing.interleaved_times`), and the ratio alone / batched is taken per round. With one
client the two are the same program, so N=1's ratio measures the noise. "merged" (N=1 only) is one
client's step on merged params (W + s A B, the learner's path before batching), against the grouped
path a single client now takes. The 1-minute load average is recorded before and after, and each
step's per-client losses (`loss_sum`: batched, alone, merged), which must agree.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.common.results import RESULTS_DIR, git_commit
from jaxrl_llm.benchmarks.common.timing import interleaved_times
from jaxrl_llm.models import DecoderConfig, chunked_logprobs_from_hidden, forward, init_params
from jaxrl_llm.serve.tinker import adapters as lora
from jaxrl_llm.serve.tinker import losses
from jaxrl_llm.serve.tinker.learner import Learner, TrainCall, TrainingModel, make_batch, new_optimizer_state, padded_width
from jaxrl_llm.serve.tinker.wire import Datum

TINY = DecoderConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=16, max_position_embeddings=128, tie_word_embeddings=False)


def base_model(name: str) -> tuple[DecoderConfig, dict]:
    """(cfg, params) served untied, as `jaxrl serve-tinker` loads it; "tiny": a random 2-layer decoder."""
    if name == "tiny":
        return TINY, init_params(TINY, jax.random.PRNGKey(0))
    from jaxrl_llm.train.policy import load_policy

    policy = load_policy(name)
    return lora.untied(policy.cfg, policy.params)


def client(base: dict, seed: int, rank: int = 8) -> TrainingModel:
    """A client's model with B drawn too (B = 0 would leave every product with it trivially zero)."""
    config = lora.AdapterConfig(rank=rank, seed=seed, targets=lora.ATTENTION_TARGETS + lora.MLP_TARGETS, unembed=True)
    adapters = lora.init_adapters(base, config)
    key = jax.random.PRNGKey(seed + 1000)
    adapters = jax.tree_util.tree_map_with_path(
        lambda path, x: 0.01 * jax.random.normal(key, x.shape) if path[-1].key == "b" else x, adapters)
    adapters = jax.device_put(adapters, jax.devices()[0])
    return TrainingModel(f"client-{seed}", "bench", config, adapters, new_optimizer_state(adapters))


def call(model: TrainingModel, vocab: int, datums: int, tokens: int, seed: int) -> TrainCall:
    rng = np.random.default_rng(seed)
    data = tuple(Datum(rng.integers(0, vocab, tokens).astype(np.int32),
                       {"target_tokens": rng.integers(0, vocab, tokens).astype(np.int64),
                        "logprobs": (-3.0 - rng.random(tokens)).astype(np.float32),
                        "advantages": rng.normal(size=tokens).astype(np.float32)}) for _ in range(datums))
    return TrainCall(model, "importance_sampling", {}, data)


@functools.partial(jax.jit, static_argnames=("cfg", "scale"))
def _merged_step(adapters, base, tokens, targets, inputs, valid, *, cfg, scale):
    def objective(adapters):
        params = lora.merge(base, adapters, scale)
        hidden, _ = forward(params, cfg, tokens, return_hidden=True)
        logp = chunked_logprobs_from_hidden(hidden, targets, params, cfg)
        return losses.total_loss(losses.LOSSES["importance_sampling"], logp, inputs, {}, valid)[0]
    return jax.value_and_grad(objective)(adapters)


def merged_step(learner: Learner, one: TrainCall):
    """One client's forward_backward on merged params (the learner's path before batching)."""
    batch = make_batch(one.data, losses.LOSSES[one.loss_fn].inputs, padded_width(one.data))
    arrays = (jnp.asarray(batch.tokens), jnp.asarray(batch.targets), {k: jnp.asarray(v) for k, v in batch.inputs.items()},
              jnp.asarray(batch.valid))
    return lambda: jax.block_until_ready(_merged_step(one.model.adapters, learner.base, *arrays, cfg=learner.cfg,
                                                      scale=one.model.config.scale))


def measure(learner: Learner, calls: list[TrainCall], rounds: int) -> dict:
    def batched():
        learner.run(calls, backward=True)
        jax.block_until_ready([one.model.grads for one in calls])

    def alone():
        for one in calls:
            learner.run([one], backward=True)
        jax.block_until_ready([one.model.grads for one in calls])

    steps = {"batched": batched, "alone": alone}
    if len(calls) == 1:
        steps["merged"] = merged_step(learner, calls[0])
    load_before = os.getloadavg()[0]
    times = interleaved_times(steps, warmup=1, iters=rounds)
    losses_by_step = {"batched": [metrics["loss:sum"] for _, metrics in learner.run(calls, backward=True)],
                      "alone": [learner.run([one], backward=True)[0][1]["loss:sum"] for one in calls]}
    if "merged" in steps:
        losses_by_step["merged"] = [float(steps["merged"]()[0])]
    for one in calls:
        one.model.grads = None
    row = {"clients": len(calls), "rounds": rounds, "load_1min_before": load_before,
           "load_1min_after": os.getloadavg()[0], "seconds": times, "loss_sum": losses_by_step,
           "alone_over_batched": [a / b for a, b in zip(times["alone"], times["batched"])]}
    row["alone_over_batched_median"] = statistics.median(row["alone_over_batched"])
    if "merged" in times:
        row["grouped_over_merged"] = [g / m for g, m in zip(times["batched"], times["merged"])]
        row["grouped_over_merged_median"] = statistics.median(row["grouped_over_merged"])
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--datums", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--tiny", action="store_true", help="a tiny random decoder, 1 and 2 clients, 2 rounds")
    parser.add_argument("--out", default=None, help=f"JSON file (default: {RESULTS_DIR}/tinker-batching-cpu-DATE.json)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.model, args.clients, args.rounds = "tiny", [1, 2], 2
    cfg, params = base_model(args.model)
    learner = Learner(cfg, params)
    models = [client(params, seed) for seed in range(max(args.clients))]
    rows = []
    for n in args.clients:
        calls = [call(m, cfg.vocab_size, args.datums, args.tokens, seed) for seed, m in enumerate(models[:n])]
        rows.append(measure(learner, calls, args.rounds))
        row = rows[-1]
        merged = (f"; grouped / merged {row['grouped_over_merged_median']:.2f}x" if "grouped_over_merged" in row else "")
        print(f"{n} clients: alone / batched {row['alone_over_batched_median']:.2f}x (median of {args.rounds}), "
              f"batched {statistics.median(row['seconds']['batched']):.2f} s{merged}; load {row['load_1min_before']:.1f} "
              f"-> {row['load_1min_after']:.1f}", flush=True)
    result = {"backend": jax.default_backend(), "jax": jax.__version__, "commit": git_commit(),
              "date": datetime.date.today().isoformat(), "cpus": os.cpu_count(), "model": args.model,
              "datums_per_client": args.datums, "tokens_per_datum": args.tokens, "rank": 8,
              "loss": "importance_sampling", "rows": rows}
    out = Path(args.out) if args.out else RESULTS_DIR / f"tinker-batching-cpu-{result['date']}.json"
    if args.out or not args.tiny:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
