"""Rollout benchmarks for SmolLM2-135M: the vLLM CPU server, measured side by
side with references taken in the same run.

    python -m jaxrl_llm.benchmarks.cpu.rollout [--dtypes float32,bfloat16] [--prompts 8] [--n 8]
                                           [--max-tokens 64] [--sync-iters 3] [--no-jax] [--compile]
                                           [--table-batches 8,64,256] [--table-lengths 32,256] [--no-table]
                                           [--table-modes compiled,eager] [--table-stops eos,fixed] [--table-seeds 0,1,2]

First, the ratio table: JAX sampler tokens/s / vLLM-CPU (float32) tokens/s at
each batch size, completion length and stop kind (EOS stop; fixed length with
ignore_eos on both engines, so both draw the same tokens), for vLLM compiled
(its default) and eager, max_num_seqs >= the batch, >= 3 seeds per cell with
both engines timed in turns (`bench_ratio_table`).

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
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir
from jaxrl_llm.models import token_logprobs
from jaxrl_llm.reports import stats
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

    from jaxrl_llm.benchmarks.common.timing import interleaved_times
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


STOPS = {"eos": False, "fixed": True}  # cell kind -> SamplingParams.ignore_eos


class CellTiming(NamedTuple):
    """One seed of one cell: each engine's seconds and completion tokens."""
    seed: int
    jax_s: float
    jax_tokens: int
    vllm_s: float
    vllm_tokens: int


def time_cell(sampler, engine, prompts, n: int, max_tokens: int, stop: str, seeds: list[int]) -> list[CellTiming]:
    """Both engines on one cell, seed by seed, in turns (the first engine alternates); an
    untimed call of each first (the JAX program of this shape compiles, vLLM warms up). A
    fixed-length cell must draw batch x max_tokens tokens on both engines."""
    sampling = {s: SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=s, ignore_eos=STOPS[stop])
                for s in seeds}
    sampler.generate(prompts, n, sampling[seeds[0]])
    engine.generate(prompts, n, sampling[seeds[0]])
    timings = []
    for i, seed in enumerate(seeds):
        engines = (sampler, engine) if i % 2 == 0 else (engine, sampler)
        got = {id(e): timed_generate(e, prompts, n, sampling[seed])[1:] for e in engines}
        (jax_s, jax_tokens), (vllm_s, vllm_tokens) = got[id(sampler)], got[id(engine)]
        if STOPS[stop] and not jax_tokens == vllm_tokens == len(prompts) * n * max_tokens:
            raise RuntimeError(f"fixed-length cell drew {jax_tokens} (JAX) / {vllm_tokens} (vLLM) tokens, "
                               f"not {len(prompts) * n} x {max_tokens}: ignore_eos did not hold")
        timings.append(CellTiming(seed, jax_s, jax_tokens, vllm_s, vllm_tokens))
    return timings


def cell_summary(mode: str, stop: str, batch: int, max_tokens: int, timings: list[CellTiming], load: tuple) -> dict:
    ratios = [(t.jax_tokens / t.jax_s) / (t.vllm_tokens / t.vllm_s) for t in timings]
    ratio, low, high, _ = stats.log_interval(ratios)
    return {"vllm_mode": mode, "stop": stop, "batch": batch, "max_tokens": max_tokens,
            "load_before": load[0], "load_after": os.getloadavg()[0], "seeds": [t.seed for t in timings],
            "jax_tokens_per_s": float(np.mean([t.jax_tokens / t.jax_s for t in timings])),
            "vllm_tokens_per_s": float(np.mean([t.vllm_tokens / t.vllm_s for t in timings])),
            "jax_tokens": sum(t.jax_tokens for t in timings), "vllm_tokens": sum(t.vllm_tokens for t in timings),
            "ratio": ratio, "ratio_low": low, "ratio_high": high, "ratio_per_seed": ratios,
            "per_seed": [t._asdict() for t in timings]}


def ratio_markdown(cells: list[dict], startups: dict[str, float]) -> str:
    """The table of docs/benchmarks.md: one row per cell, each number's vLLM mode named."""
    lines = ["| vLLM mode (startup) | stop | batch x new tokens | JAX tok/s | vLLM tok/s | JAX / vLLM, geometric mean "
             "[95% t on log] (n seeds) | tokens JAX / vLLM | load |", "|" + "---|" * 8]
    for c in cells:
        interval = f"[{c['ratio_low']:.2f}, {c['ratio_high']:.2f}]" if np.isfinite(c["ratio_low"]) else "(no interval)"
        lines.append(f"| {c['vllm_mode']} ({startups[c['vllm_mode']]:.0f} s) | {c['stop']} | {c['batch']} x "
                     f"{c['max_tokens']} | {c['jax_tokens_per_s']:.0f} | {c['vllm_tokens_per_s']:.0f} | "
                     f"**{c['ratio']:.2f}x** {interval} ({len(c['seeds'])}) | {c['jax_tokens']} / {c['vllm_tokens']} | "
                     f"{c['load_before']:.1f}-{c['load_after']:.1f} |")
    return "\n".join(lines)


def bench_ratio_table(hf_dir: str, cfg, params, args) -> tuple[list[dict], dict[str, float]]:
    """Generation throughput of the JAX sampler and of a float32 vLLM server, cell by cell, for
    each vLLM mode (`compiled`: vLLM's default torch.compile; `eager`: --enforce-eager): every
    batch size (8 prompts x batch/8 samples) x completion length x stop kind (`eos`: each
    engine stops at EOS, so the two draw different numbers of tokens; `fixed`: ignore_eos on
    both, every row runs to max_tokens, the same number of tokens), temperature 1, float32
    both, the server's max_num_seqs >= the largest batch. Each cell runs `args.table_seeds`
    sampling seeds, both engines in turns per seed, and reports the geometric mean of the
    per-seed ratios with its interval on the log scale, and the load. Returns the cells and
    each mode's server startup seconds."""
    from jaxrl_llm.rollout.jax_sampler import JaxSampler

    prompts = chat_prompts(hf_dir, 8)
    sampler = JaxSampler(cfg, params, eos_token_ids=[EOS])
    batches = [int(x) for x in args.table_batches.split(",")]
    seeds = [int(x) for x in args.table_seeds.split(",")]
    cells, startups = [], {}
    for mode in args.table_modes.split(","):
        config = VLLMServerConfig(model_dir=hf_dir, dtype="float32", max_model_len=512,
                                  kv_cache_gib=args.table_kv_gib, enforce_eager=mode == "eager",
                                  max_num_seqs=max(max(batches), 128))
        start = time.perf_counter()
        with VLLMServer(config) as server:
            startups[mode] = time.perf_counter() - start
            engine = VLLMEngine(VLLMClient([server.url]), None, servers=[server])
            engine.generate(prompts[:1], 1, SamplingParams(max_tokens=4))  # first-request warm-up
            print(f"  vLLM {mode}: startup {startups[mode]:.1f} s; JAX sampler / vLLM float32 tokens/s, "
                  f"{len(seeds)} seeds per cell in turns:", flush=True)
            for stop in args.table_stops.split(","):
                for max_tokens in (int(x) for x in args.table_lengths.split(",")):
                    for batch in batches:
                        n = max(1, batch // len(prompts))
                        load = os.getloadavg()
                        timings = time_cell(sampler, engine, prompts, n, max_tokens, stop, seeds)
                        cells.append(cell_summary(mode, stop, len(prompts) * n, max_tokens, timings, load))
                        c = cells[-1]
                        print(f"    {mode:8s} {stop:5s} {c['batch']:4d} x {max_tokens:4d} | JAX "
                              f"{c['jax_tokens_per_s']:8.1f} vLLM {c['vllm_tokens_per_s']:8.1f} tok/s | "
                              f"{c['ratio']:.2f}x [{c['ratio_low']:.2f}, {c['ratio_high']:.2f}] | tokens "
                              f"{c['jax_tokens']} / {c['vllm_tokens']} | load {c['load_before']:.1f}", flush=True)
    print(ratio_markdown(cells, startups), flush=True)
    return cells, startups


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
    parser.add_argument("--table-kv-gib", type=int, default=3, help="vLLM KV cache of the ratio table's server")
    parser.add_argument("--table-seeds", default="0,1,2", help="sampling seeds per cell of the ratio table (>= 3 "
                        "for an interval worth the name), both engines in turns per seed")
    parser.add_argument("--table-modes", default="compiled,eager",
                        help="vLLM modes of the ratio table: compiled (vLLM's default) and/or eager")
    parser.add_argument("--table-stops", default="eos,fixed",
                        help="cell kinds: eos (each engine stops at EOS) and/or fixed (ignore_eos on both)")
    parser.add_argument("--no-table", action="store_true", help="skip the JAX / vLLM ratio table")
    parser.add_argument("--only-table", action="store_true", help="run the ratio table alone")
    args = parser.parse_args(argv)

    hf_dir = smollm2_hf_dir()
    cfg, params = load_hf_dir(hf_dir)
    prompts = chat_prompts(hf_dir, args.prompts)
    learner = make_learner_logprobs(cfg)
    results = {"prompts": args.prompts, "n": args.n, "max_tokens": args.max_tokens, "servers": []}
    if not args.no_table:
        results["ratio_table"], results["vllm_startup_s"] = bench_ratio_table(hf_dir, cfg, params, args)
        results["load_average_end"] = os.getloadavg()
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
