"""Rollout benchmarks for SmolLM2-135M: the vLLM CPU server, measured side by
side with references taken in the same run.

    python -m jaxrl_llm.benchmarks.rollout [--dtypes float32,bfloat16] [--prompts 8] [--n 8]
                                           [--max-tokens 64] [--sync-iters 3] [--no-jax] [--compile]
                                           [--table-batches 8,64,256] [--table-lengths 32,256] [--no-table]

First, the ratio table: JAX sampler tokens/s / vLLM-CPU (float32) tokens/s at
each batch size and completion length, both engines timed back to back per
cell on one server (`bench_ratio_table`).

For each server dtype, one real vLLM server is started and measured:

1. generation throughput: completion tokens/s for prompts x n samples at
   temperature 1 (fixed seed), against the in-process JAX sampler on the
   same prompts and settings (reference; ratio vLLM / JAX).
2. training-inference mismatch: the vLLM sampler logprobs mu of those
   samples vs the float32 JAX learner's recomputed pi_old (the metrics of
   docs/objectives.md#mismatch-metrics,
   jaxrl_llm.core.corrections.mismatch_metrics).
3. weight sync: wall time of export -> reload -> prefix-cache reset ->
   verified probe (DiskWeightSync), split by phase; against the server's own
   cold start (the naive alternative: restart the server on new weights).
   First, before any server starts, the export alone: the checkpoint writer
   into a new directory vs the sync writer rewriting the previous copy in
   place (interleaved).

Numbers depend on load: the machine's 2 cores are shared, so run it alone.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir
from jaxrl_llm.models import token_logprobs
from jaxrl_llm.rollout import (DiskWeightSync, LogprobProbe, SamplingParams, VLLMClient, VLLMEngine, VLLMServer,
                               VLLMServerConfig, bridge_export)
from jaxrl_llm.rollout.weight_sync import default_stage_root

QUESTIONS = ["What is {a} + {b}? Answer with just the number.", "Name a colour that starts with {c}.",
             "Write a short sentence about the number {a}.", "What is {a} times {b}?"]
EOS = 2
# Per-token tolerance of the post-sync probe, by server dtype: float32 differs
# from the float32 learner by kernel noise only; bfloat16 by rounding.
PROBE_ATOL = {"float32": 2e-3, "bfloat16": 1.0, "float16": 0.3}


def chat_prompts(hf_dir: str, count: int) -> list[list[int]]:
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(hf_dir) / "tokenizer.json"))
    prompts = []
    for i in range(count):
        question = QUESTIONS[i % len(QUESTIONS)].format(a=i % 10, b=(3 * i + 1) % 10, c="ABCDEFGH"[i % 8])
        text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
        prompts.append(tokenizer.encode(text, add_special_tokens=False).ids)
    return prompts


def make_learner_logprobs(cfg):
    """(params, sequences) -> per-sequence float64 log p(x_t | x_<t), padded to 64-multiples for few compiles."""
    step = jax.jit(lambda params, tokens, mask: token_logprobs(params, cfg, tokens, attention_mask=mask))

    def compute(params, sequences):
        width = -(-max(len(s) for s in sequences) // 64) * 64
        tokens = np.zeros((len(sequences), width), np.int32)
        mask = np.zeros_like(tokens)
        for i, seq in enumerate(sequences):
            tokens[i, :len(seq)], mask[i, :len(seq)] = seq, 1
        out = np.asarray(step(params, jnp.asarray(tokens), jnp.asarray(mask)), np.float64)
        return [out[i, :len(seq) - 1] for i, seq in enumerate(sequences)]

    return compute


def timed_generate(engine, prompts, n, sampling) -> tuple[object, float, int]:
    start = time.perf_counter()
    batch = engine.generate(prompts, n, sampling)
    seconds = time.perf_counter() - start
    return batch, seconds, int(sum(r.num_completion_tokens for r in batch))


def mismatch(batch, params, learner) -> dict[str, float]:
    from jaxrl_llm.core.corrections import mismatch_metrics

    sequences = [np.concatenate([r.prompt_token_ids, r.completion_token_ids]) for r in batch]
    full = learner(params, sequences)
    _, mu, mask = batch.padded_completions()
    pi = np.zeros_like(mu)
    for i, (lp, r) in enumerate(zip(full, batch)):
        completion = lp[len(r.prompt_token_ids) - 1:]
        pi[i, :len(completion)] = completion
    metrics = {k: float(v) for k, v in mismatch_metrics(pi, mu, mask).items()}
    metrics["max_abs_logprob_diff"] = float(np.max(np.abs(mu - pi) * mask))
    return metrics


def bench_server(dtype: str, hf_dir: str, cfg, params, prompts, args, learner) -> dict:
    config = VLLMServerConfig(model_dir=hf_dir, dtype=dtype, max_model_len=512, kv_cache_gib=1,
                              enforce_eager=not args.compile)
    result: dict = {"dtype": dtype, "enforce_eager": not args.compile}
    start = time.perf_counter()
    with VLLMServer(config) as server:
        result["startup_s"] = time.perf_counter() - start
        client = VLLMClient([server.url])
        probe_ids = prompts[0] + [9302, 305, 570, 314, EOS]
        probe = LogprobProbe(probe_ids, lambda p: learner(p, [probe_ids])[0], atol=PROBE_ATOL[dtype])
        # A float32 server needs float32 files for exactness; a 16-bit server casts anyway.
        export_dtype = "float32" if dtype == "float32" else dtype
        sync = DiskWeightSync(client, bridge_export(cfg, export_dtype), probe=probe)
        engine = VLLMEngine(client, sync, servers=[server])
        sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=0)
        engine.generate(prompts[:1], 1, SamplingParams(max_tokens=4))  # first-request warm-up
        batch, seconds, tokens = timed_generate(engine, prompts, args.n, sampling)
        result["generate"] = {"seconds": seconds, "completion_tokens": tokens, "tokens_per_s": tokens / seconds}
        result["mismatch_vs_fp32_learner"] = mismatch(batch, params, learner)
        learner(params, [probe_ids])  # compile the probe's learner program outside the timing
        reports = [sync.push(params, engine.weight_version + 1 + i) for i in range(args.sync_iters)]
        sync.close()
        result["weight_sync"] = {
            "export_dtype": export_dtype,
            "median_total_s": statistics.median(r.total_s for r in reports),
            "median_export_s": statistics.median(r.export_s for r in reports),
            "median_reload_s": statistics.median(r.reload_s for r in reports),
            "median_verify_s": statistics.median(r.verify_s for r in reports),
            "probe_max_abs_diff": max(r.probe_max_abs_diff for r in reports),
            "speedup_vs_server_restart": result["startup_s"] / statistics.median(r.total_s for r in reports),
        }
    return result


def bench_export_paths(cfg, params, dtype: str, iters: int) -> dict[str, float]:
    """Median seconds of the weight-sync export, interleaved: the checkpoint writer into a new
    directory (``save_hf_dir``, no fsync: the export before in-place staging) vs the sync writer
    rewriting the previous copy in place with parallel writers (``bridge_export``)."""
    import shutil
    import tempfile

    from jaxrl_llm.benchmarks.timing import interleaved_times
    from jaxrl_llm.bridge import save_hf_dir

    root = Path(tempfile.mkdtemp(prefix="jaxrl-export-bench-", dir=default_stage_root()))
    in_place = bridge_export(cfg, dtype)
    try:
        steps = {"new directory (save_hf_dir)": lambda: save_hf_dir(cfg, params, root / "new", dtype=dtype, fsync=False),
                 "in place, parallel writers": lambda: in_place(params, root / "reused")}
        times = interleaved_times(steps, 1, iters)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {name: statistics.median(t) for name, t in times.items()}


def bench_jax_sampler(cfg, params, prompts, args) -> dict:
    from jaxrl_llm.rollout.jax_sampler import JaxSampler

    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, seed=0)
    start = time.perf_counter()
    sampler.generate(prompts, args.n, sampling)  # compiles
    compile_s = time.perf_counter() - start
    _, seconds, tokens = timed_generate(sampler, prompts, args.n, sampling)
    return {"compile_and_first_s": compile_s, "seconds": seconds, "completion_tokens": tokens,
            "tokens_per_s": tokens / seconds}


def bench_ratio_table(hf_dir: str, cfg, params, args) -> list[dict]:
    """Generation throughput of the JAX sampler and of one float32 vLLM server, cell by cell:
    every batch size (8 prompts x batch/8 samples) at every completion length, same prompts,
    temperature 1, seed 0, EOS stop, float32 both; each cell times the two engines in turns,
    ``args.table_rounds`` times each (the JAX program is compiled by an untimed first call),
    keeps each engine's fastest round (on a shared machine the slow rounds are other jobs'
    load, not the engine) and records the load."""
    from jaxrl_llm.rollout.jax_sampler import JaxSampler

    prompts = chat_prompts(hf_dir, 8)
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    config = VLLMServerConfig(model_dir=hf_dir, dtype="float32", max_model_len=512, kv_cache_gib=args.table_kv_gib,
                              enforce_eager=not args.compile)
    cells = []
    with VLLMServer(config) as server:
        engine = VLLMEngine(VLLMClient([server.url]), None, servers=[server])
        engine.generate(prompts[:1], 1, SamplingParams(max_tokens=4))  # first-request warm-up
        print(f"  JAX sampler / vLLM float32, tokens/s ({len(prompts)} prompts x batch/{len(prompts)} samples, "
              f"temperature 1, EOS stop; fastest of {args.table_rounds} calls each, in turns):", flush=True)
        print("    batch  new tokens |   JAX tok/s   vLLM tok/s |  JAX / vLLM | load", flush=True)
        for max_tokens in (int(x) for x in args.table_lengths.split(",")):
            for batch in (int(x) for x in args.table_batches.split(",")):
                n = max(1, batch // len(prompts))
                sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=0)
                sampler.generate(prompts, n, sampling)  # compiles this shape
                rounds = [(timed_generate(sampler, prompts, n, sampling)[1:],
                           timed_generate(engine, prompts, n, sampling)[1:]) for _ in range(args.table_rounds)]
                jax_s, jax_tokens = min(r[0] for r in rounds)  # same seed: the same tokens every round
                vllm_s, vllm_tokens = min(r[1] for r in rounds)
                cell = {"batch": len(prompts) * n, "max_tokens": max_tokens, "load": os.getloadavg()[0],
                        "jax_tokens_per_s": jax_tokens / jax_s, "vllm_tokens_per_s": vllm_tokens / vllm_s,
                        "jax_tokens": jax_tokens, "vllm_tokens": vllm_tokens}
                cell["ratio"] = cell["jax_tokens_per_s"] / cell["vllm_tokens_per_s"]
                cells.append(cell)
                print(f"    {cell['batch']:5d}  {max_tokens:10d} | {cell['jax_tokens_per_s']:11.1f} "
                      f"{cell['vllm_tokens_per_s']:12.1f} | {cell['ratio']:10.2f}x | {cell['load']:.1f}", flush=True)
    return cells


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--sync-iters", type=int, default=3)
    parser.add_argument("--no-jax", action="store_true", help="skip the JAX sampler reference")
    parser.add_argument("--compile", action="store_true", help="torch.compile the server (slow start)")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    parser.add_argument("--table-batches", default="8,64,256",
                        help="sequences per call of the JAX / vLLM ratio table (multiples of 8)")
    parser.add_argument("--table-lengths", default="32,256", help="new tokens per sequence of the ratio table")
    parser.add_argument("--table-kv-gib", type=int, default=2, help="vLLM KV cache of the ratio table's server")
    parser.add_argument("--table-rounds", type=int, default=2,
                        help="timed calls per engine and cell of the ratio table, in turns; the fastest counts")
    parser.add_argument("--no-table", action="store_true", help="skip the JAX / vLLM ratio table")
    parser.add_argument("--only-table", action="store_true", help="run the ratio table alone")
    args = parser.parse_args(argv)

    hf_dir = smollm2_hf_dir()
    cfg, params = load_hf_dir(hf_dir)
    prompts = chat_prompts(hf_dir, args.prompts)
    learner = make_learner_logprobs(cfg)
    results = {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens, "servers": []}
    if not args.no_table:
        results["ratio_table"] = bench_ratio_table(hf_dir, cfg, params, args)
        if args.only_table:
            if args.out:
                Path(args.out).parent.mkdir(parents=True, exist_ok=True)
                Path(args.out).write_text(json.dumps(results, indent=2))
            return results
    print(f"SmolLM2-135M, {args.prompts} prompts x {args.n} samples, <= {args.max_tokens} tokens, temperature 1")
    print(f"  weight-sync export to {default_stage_root()} (median of {args.sync_iters}, interleaved; "
          f"load average {os.getloadavg()[0]:.1f}):")
    results["export_paths"] = {}
    for dtype in args.dtypes.split(","):
        export_dtype = "float32" if dtype.strip() == "float32" else dtype.strip()
        paths = results["export_paths"][export_dtype] = bench_export_paths(cfg, params, export_dtype, args.sync_iters)
        print("    " + export_dtype + ": " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in paths.items()))
    if not args.no_jax:
        results["jax_sampler"] = jax_result = bench_jax_sampler(cfg, params, prompts, args)
        print(f"  JAX sampler (float32, reference): {jax_result['tokens_per_s']:8.1f} tok/s "
              f"({jax_result['completion_tokens']} tokens in {jax_result['seconds']:.1f} s)")
    for dtype in args.dtypes.split(","):
        r = bench_server(dtype.strip(), hf_dir, cfg, params, prompts, args, learner)
        results["servers"].append(r)
        g, m, s = r["generate"], r["mismatch_vs_fp32_learner"], r["weight_sync"]
        ratio = (f"  = {g['tokens_per_s'] / results['jax_sampler']['tokens_per_s']:.2f}x JAX sampler"
                 if "jax_sampler" in results else "")
        print(f"  vLLM {dtype:<8} startup {r['startup_s']:6.1f} s | {g['tokens_per_s']:8.1f} tok/s{ratio}")
        print(f"      mismatch vs fp32 learner: k1 {m['mismatch_k1']:.3e}  k2 {m['mismatch_k2']:.3e}  "
              f"k3 {m['mismatch_k3']:.3e}  max|dlogp| {m['max_abs_logprob_diff']:.3e}  "
              f"pearson {m['mismatch_prob_pearson']:.6f}  seq-ESS {m['mismatch_seq_ess']:.4f}")
        print(f"      weight sync ({s['export_dtype']} files): {s['median_total_s']:.2f} s = export "
              f"{s['median_export_s']:.2f} + reload {s['median_reload_s']:.2f} + verify {s['median_verify_s']:.2f}"
              f"  (probe diff {s['probe_max_abs_diff']:.2e}); {s['speedup_vs_server_restart']:.0f}x faster "
              f"than a server restart")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
