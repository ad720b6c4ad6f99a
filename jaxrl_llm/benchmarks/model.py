"""Learner throughput of SmolLM2-135M: our jitted JAX model vs the same weights in PyTorch.

    python -m jaxrl_llm.benchmarks.model [--batch 4] [--seq 128] [--warmup 2] [--iters 5]

One run measures, side by side on the same batch of random tokens:

1. forward+backward tokens/s of loss = -mean_t log pi(y_t | y_<t), float32:
   ours = jax.jit(jax.value_and_grad) over ``models.token_logprobs`` (chunked
   log-softmax); reference = transformers ``LlamaForCausalLM`` with the same
   weights, loss.backward(), at 1 and all OpenMP threads (on a shared machine 1
   thread can be faster). The engines take turns every round, so drifting load
   hits both alike; medians are reported. Prints the ratio ours / best torch.
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
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import (DecoderConfig, chunked_logprobs_from_hidden, lm_head_logits, logprobs_from_logits,
                              params_from_hf, token_logprobs)

# SmolLM2-135M-Instruct's architecture (the values load_gguf reads from the GGUF).
SMOLLM2_HF_CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True)


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


def interleaved_times(steps: dict[str, Callable[[], None]], warmup: int, iters: int) -> dict[str, list[float]]:
    """Time every step once per round, round after round, so all of them see the same
    machine load (on a shared machine the load drifts during a run)."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(iters):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return times


def jax_step(cfg, params, tokens: np.ndarray, chunk_size: int, result: dict) -> Callable[[], None]:
    """One jitted forward+backward of loss = -mean log pi (chunked log-probs)."""
    def loss(params, tokens):
        return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=chunk_size))

    step = jax.jit(jax.value_and_grad(loss))
    tokens = jnp.asarray(tokens)

    def run():
        value, grads = step(params, tokens)
        jax.block_until_ready(grads)
        result["loss"] = float(value)

    return run


def torch_step(model, tokens: np.ndarray, threads: int, result: dict) -> Callable[[], None]:
    """The same loss with transformers' model, forward+backward, on ``threads`` OpenMP threads."""
    import torch

    batch = torch.tensor(tokens, dtype=torch.long)

    def run():
        torch.set_num_threads(threads)
        model.zero_grad(set_to_none=True)
        logits = model(batch).logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, batch[:, 1:, None])[..., 0]
        loss = -logp.mean()
        loss.backward()
        result["loss"] = float(loss.detach())

    return run


def smollm2_models(random_weights: bool):
    """(cfg, params, torch model) holding the same SmolLM2-135M weights: the GGUF's, or a random init
    (throughput does not depend on the values; lets the benchmark run where the GGUF is absent)."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if not random_weights:
        from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir
        model_dir = smollm2_hf_dir()
        cfg, params = load_hf_dir(model_dir)
        return cfg, params, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    config = LlamaConfig(**SMOLLM2_HF_CONFIG)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    cfg = DecoderConfig.from_hf(config.to_dict())
    state = {name: tensor.detach().numpy() for name, tensor in model.state_dict().items()}
    params = jax.tree_util.tree_map(jnp.asarray, params_from_hf(state, cfg))
    return cfg, params, model


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
    from jaxrl_llm.bridge import save_hf_dir

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
    parser.add_argument("--random-weights", action="store_true", help="random init instead of the GGUF weights")
    parser.add_argument("--skip-export", action="store_true", help="do not time the weight-sync export")
    # OpenMP threads of torch; the best setting is the reference (on a busy machine 1 thread can win).
    parser.add_argument("--torch-threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    args = parser.parse_args(argv)

    cfg, params, torch_model = smollm2_models(args.random_weights)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (args.batch, args.seq)).astype(np.int32)
    num_tokens = args.batch * args.seq
    print(f"SmolLM2-135M float32 ({'random' if args.random_weights else 'GGUF'} weights), batch {args.batch} x "
          f"{args.seq} tokens, {args.warmup} warm-up + {args.iters} timed rounds (interleaved), loss = -mean log pi; "
          f"jax {jax.__version__} on {jax.devices()[0].platform}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    results: dict[str, dict] = {"jax": {}}
    steps = {"jax": jax_step(cfg, params, tokens, args.chunk_size, results["jax"])}
    for threads in ([] if args.skip_torch else args.torch_threads):
        name = f"torch-{threads}"
        results[name] = {}
        steps[name] = torch_step(torch_model, tokens, threads, results[name])
    times = interleaved_times(steps, args.warmup, args.iters)
    throughput = {name: num_tokens / statistics.median(t) for name, t in times.items()}
    for name, seconds in times.items():
        label = ("jax (jit, chunked logprobs)" if name == "jax"
                 else f"torch (transformers, {name.split('-')[1]} thread(s))")
        print(f"  {label:<32}: {statistics.median(seconds):7.3f} s/step (median)  {throughput[name]:9.1f} tokens/s  "
              f"loss {results[name]['loss']:.6f}")
    torch_names = [name for name in throughput if name != "jax"]
    if torch_names:
        best = max(torch_names, key=throughput.get)
        print(f"  ratio jax / best torch ({best}) tokens/s: {throughput['jax'] / throughput[best]:.2f}x  "
              f"(loss rel diff {abs(results['jax']['loss'] - results[best]['loss']) / abs(results[best]['loss']):.1e})")

    for batch, seq in ((args.batch, args.seq), (args.batch, 8 * args.seq)):
        memory = logprob_head_temp_bytes(cfg, params, batch, seq, args.chunk_size)
        print(f"  logprob fwd+bwd temp memory {batch}x{seq} (XLA): chunked({args.chunk_size}) "
              f"{memory['chunked'] / 2**20:7.1f} MiB, naive {memory['naive'] / 2**20:7.1f} MiB "
              f"({memory['naive'] / max(memory['chunked'], 1):.1f}x; full logits {batch * seq * cfg.vocab_size * 4 / 2**20:.0f} MiB)")
    for label, seconds in ({} if args.skip_export else bench_export(cfg, params, iters=3)).items():
        print(f"  weight sync save_hf_dir {label:<18}: {seconds:6.3f} s")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (other processes share these CPUs)")


if __name__ == "__main__":
    main()
