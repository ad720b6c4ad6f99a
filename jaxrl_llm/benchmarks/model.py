"""Learner throughput of SmolLM2-135M: our jitted JAX model vs the same weights in PyTorch.

    python -m jaxrl_llm.benchmarks.model [--batch 4] [--seq 128] [--warmup 2] [--iters 5]

One run measures, side by side on the same batch of random tokens:

1. forward+backward tokens/s of loss = -mean_t log pi(y_t | y_<t), float32:
   ours = jax.jit(jax.value_and_grad) over ``models.token_logprobs`` (chunked
   log-softmax); reference = transformers ``LlamaForCausalLM`` loaded from the
   same HF directory, loss.backward(), at 1 and all OpenMP threads (on a shared
   machine 1 thread can be faster). Prints the ratio ours / best torch.
2. peak temporary memory of forward+backward through the LM head and
   log-softmax, chunked vs naive (full [B, T, V] logits), from XLA's compiled
   memory analysis, at the benchmark shape and at 8x its length.
3. the weight-sync export: ``bridge.save_hf_dir`` wall time (fsynced, atomic).
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.bridge import load_hf_dir, save_hf_dir, smollm2_hf_dir
from jaxrl_llm.models import (chunked_logprobs_from_hidden, forward, lm_head_logits, logprobs_from_logits,
                              token_logprobs)


def _timed(step, warmup: int, iters: int) -> list[float]:
    """Seconds per call of ``step()`` (which must block until its result is ready)."""
    for _ in range(warmup):
        step()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return times


def bench_jax(cfg, params, tokens: np.ndarray, chunk_size: int, warmup: int, iters: int):
    def loss(params, tokens):
        return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=chunk_size))

    step = jax.jit(jax.value_and_grad(loss))
    tokens = jnp.asarray(tokens)
    result = {}

    def run():
        loss, grads = step(params, tokens)
        jax.block_until_ready(grads)
        result["loss"] = float(loss)

    return _timed(run, warmup, iters), result


def bench_torch(model_dir: str, tokens: np.ndarray, warmup: int, iters: int, threads: int):
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    batch = torch.tensor(tokens, dtype=torch.long)
    result = {}

    def run():
        model.zero_grad(set_to_none=True)
        logits = model(batch).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]
        loss = -logp.mean()
        loss.backward()
        result["loss"] = float(loss.detach())

    return _timed(run, warmup, iters), result


def logprob_head_temp_bytes(cfg, params, batch: int, seq: int, chunk_size: int) -> dict[str, int]:
    """XLA's temp-buffer size of forward+backward through the LM head + log-softmax alone
    (grads w.r.t. hidden states and the tied embedding), chunked vs naive [B, T, V] logits."""
    hidden = jax.ShapeDtypeStruct((batch, seq, cfg.hidden_size), jnp.float32)
    targets = jax.ShapeDtypeStruct((batch, seq), jnp.int32)
    head = {"embed": params["embed"], "lm_head": params.get("lm_head")}

    def chunked(head, hidden, targets):
        return -jnp.mean(chunked_logprobs_from_hidden(hidden, targets, head, cfg, chunk_size=chunk_size))

    def naive(head, hidden, targets):
        return -jnp.mean(logprobs_from_logits(lm_head_logits(hidden, head, cfg), targets))

    out = {}
    for name, loss in (("chunked", chunked), ("naive", naive)):
        compiled = jax.jit(jax.value_and_grad(loss, argnums=(0, 1))).lower(head, hidden, targets).compile()
        analysis = compiled.memory_analysis()
        out[name] = int(analysis.temp_size_in_bytes) if analysis is not None else -1
    return out


def bench_export(cfg, params, iters: int) -> dict[str, float]:
    """Median seconds of save_hf_dir (atomic, fsynced) per dtype and destination."""
    out = {}
    roots = [("disk", tempfile.gettempdir())] + ([("shm", "/dev/shm")] if os.path.isdir("/dev/shm") else [])
    for label, root in roots:
        with tempfile.TemporaryDirectory(dir=root) as folder:
            for dtype in ("float32", "bfloat16"):
                times = _timed(lambda: save_hf_dir(cfg, params, os.path.join(folder, "sync"), dtype=dtype), 1, iters)
                out[f"{dtype} -> {label}"] = statistics.median(times)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--skip-torch", action="store_true")
    # OpenMP threads of torch; the best setting is the reference (on a busy machine 1 thread can win).
    parser.add_argument("--torch-threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    args = parser.parse_args(argv)

    model_dir = smollm2_hf_dir()
    cfg, params = load_hf_dir(model_dir)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    num_tokens = args.batch * args.seq
    print(f"SmolLM2-135M float32, batch {args.batch} x {args.seq} tokens, {args.warmup} warm-up + {args.iters} timed "
          f"iterations, loss = -mean log pi; jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")

    jax_times, jax_result = bench_jax(cfg, params, tokens, args.chunk_size, args.warmup, args.iters)
    jax_tps = num_tokens / statistics.mean(jax_times)
    print(f"  jax   (jit, chunked logprobs) : {statistics.mean(jax_times):7.3f} s/step  {jax_tps:9.1f} tokens/s  "
          f"loss {jax_result['loss']:.6f}")
    best = None
    for threads in ([] if args.skip_torch else args.torch_threads):
        torch_times, torch_result = bench_torch(model_dir, tokens, args.warmup, args.iters, threads)
        torch_tps = num_tokens / statistics.mean(torch_times)
        best = max(best or 0.0, torch_tps)
        print(f"  torch (transformers, {threads} thread{'s' if threads > 1 else ''}): "
              f"{statistics.mean(torch_times):7.3f} s/step  {torch_tps:9.1f} tokens/s  loss {torch_result['loss']:.6f}"
              f"  (loss rel diff {abs(jax_result['loss'] - torch_result['loss']) / abs(torch_result['loss']):.1e})")
    if best:
        print(f"  ratio jax / best torch tokens/s: {jax_tps / best:.2f}x")

    for batch, seq in ((args.batch, args.seq), (args.batch, 8 * args.seq)):
        memory = logprob_head_temp_bytes(cfg, params, batch, seq, args.chunk_size)
        print(f"  logprob fwd+bwd temp memory {batch}x{seq} (XLA): chunked({args.chunk_size}) "
              f"{memory['chunked'] / 2**20:7.1f} MiB, naive {memory['naive'] / 2**20:7.1f} MiB "
              f"({memory['naive'] / max(memory['chunked'], 1):.1f}x; full logits {batch * seq * cfg.vocab_size * 4 / 2**20:.0f} MiB)")
    for label, seconds in bench_export(cfg, params, iters=3).items():
        print(f"  weight sync save_hf_dir {label:<18}: {seconds:6.3f} s")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (other processes share these CPUs)")


if __name__ == "__main__":
    main()
