"""Learner throughput of SmolLM2-135M: our jitted JAX model vs the same weights in PyTorch.

    python -m jaxrl_llm.benchmarks.cpu.model [--shapes 4x128,8x512,2x2048] [--dtypes float32,bfloat16]
        [--warmup 1] [--iters 3] [--remat auto|off|dots|full] [--profile]

One run measures, side by side on the same batches of random tokens:

1. forward+backward tokens/s of loss = -mean_t log pi(y_t | y_<t) for every batch shape
   (rows x tokens) and dtype (params, activations and matmuls in it; log-softmax in float32):
   ours = jax.jit(jax.value_and_grad) over ``models.token_logprobs`` (chunked
   log-softmax), compiled ahead of time with the learner's XLA options
   (``--remat off|dots|full``: what each layer keeps for the backward pass, as ``train.remat``
   (``models.remat``); with "off" 8x512 and 2x2048 need 11 and 24 GiB of saved activations;
   ``auto``, the default, takes the first of off, dots, full (off, full in bfloat16 on CPU:
   ``auto_remat_order``) whose compiled temp memory is under a third of the machine's RAM, and the
   row says which); reference = transformers ``LlamaForCausalLM`` with the same
   weights, loss.backward(), at 1 and all OpenMP threads (on a shared machine 1
   thread can be faster), in a child process (``benchmarks.cpu.torch_worker``: the two engines
   never share an address space, each stays under the 9 GB a process may take here);
   ``--torch-device cuda`` runs the reference on the GPU instead, beside JAX on the same GPU. The
   engines take turns every round, so drifting load hits both alike; medians are reported.
   Ends with the table of ratios ours / best torch, each process's peak RSS (VmHWM, reset
   before each row) and the load average.
   ``--profile`` adds where one JAX step's time goes, by phase (each phase jitted
   alone, timed interleaved): decoder layers forward, layers forward+backward, LM head +
   log-softmax forward+backward, the whole step.
2. peak temporary memory of forward+backward through the LM head and
   log-softmax, chunked vs naive (full [B, T, V] logits), from XLA's compiled
   memory analysis, at the benchmark shape and at 8x its length.
3. the weight-sync export: ``bridge.save_hf_dir`` wall time (fsynced, atomic).
"""
from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
from dataclasses import dataclass
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.common.timing import interleaved_times, median_seconds
from jaxrl_llm.benchmarks.cpu.torch_worker import TorchWorker, peak_rss_bytes, reset_peak_rss
from jaxrl_llm.models import (DecoderConfig, chunked_logprobs_from_hidden, forward, lm_head_logits,
                              logprobs_from_logits, params_from_hf, token_logprobs)
from jaxrl_llm.models.compile_options import learner_compiler_options
from jaxrl_llm.models.decoder import jnp_dtype
from jaxrl_llm.models.remat import REMAT_MODES, remat_mode

# SmolLM2-135M-Instruct's architecture (the values load_gguf reads from the GGUF).
SMOLLM2_HF_CONFIG = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, rms_norm_eps=1e-5, rope_theta=100000.0,
                         max_position_embeddings=8192, tie_word_embeddings=True)


def needs_remat(temp_bytes: int, ram_bytes: int) -> bool:
    """--remat auto: recompute when the saved activations would take over a third of the RAM
    (the torch worker and other processes share the machine)."""
    return temp_bytes > ram_bytes / 3


def memory_bytes(device) -> int:
    """What --remat auto budgets against: the accelerator's memory (its allocator's limit), or on CPU
    the machine's RAM."""
    stats = device.memory_stats() if device.platform != "cpu" else None
    if stats and "bytes_limit" in stats:
        return int(stats["bytes_limit"])
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def auto_remat_order(dtype: str, backend: str) -> tuple[str, ...]:
    """The remat modes --remat auto tries, in order; it takes the first whose memory fits.
    In bfloat16 on XLA:CPU "full" runs faster than "dots" with less memory, so "dots" is left out:
    the looped layers write the saved bf16 projections into their [nL, ...] stacks at a cost above
    recomputing them; in float32 it goes the other way, so float32 keeps "dots" (paired
    measurements in docs/benchmarks.md, CPU learner)."""
    if backend == "cpu" and dtype == "bfloat16":
        return ("off", "full")
    return ("off", "dots", "full")


def jax_step(cfg, params, tokens: np.ndarray, chunk_size: int, result: dict,
             remat: str = "off") -> Callable[[], None]:
    """One jitted forward+backward of loss = -mean log pi (chunked log-probs), compiled with the
    learner's XLA options (``models.compile_options``) ahead of time, so no timed call compiles.
    ``remat``: a ``models.remat`` mode ("off", "dots", "full", as the learner's ``train.remat``), or
    "auto": the first of ``auto_remat_order`` whose compiled temp memory passes ``needs_remat``
    (else "full"); ``result["remat"]`` says which ran."""
    def compiled(mode: str):
        def loss(params, tokens):
            return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=chunk_size, remat=mode))

        options = learner_compiler_options(cfg.compute_dtype, jax.default_backend())  # as the learner compiles
        return jax.jit(jax.value_and_grad(loss), compiler_options=options).lower(params, tokens).compile()

    tokens = jnp.asarray(tokens)
    if remat == "auto":
        ram = memory_bytes(jax.devices()[0])
        for remat in auto_remat_order(cfg.compute_dtype, jax.default_backend()):
            step = compiled(remat)
            analysis = step.memory_analysis()
            if remat == "full" or analysis is None or not needs_remat(int(analysis.temp_size_in_bytes), ram):
                break
    else:
        step = compiled(remat_mode(remat))
    result["remat"] = remat

    def run():
        value, grads = step(params, tokens)
        jax.block_until_ready(grads)
        result["loss"] = float(value)

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


def smollm2_checkpoint(random_weights: bool, folder: str) -> tuple[DecoderConfig, dict, str]:
    """(cfg, float32 params, HF checkpoint directory of the same weights) for the torch worker: the
    GGUF's converted directory, or the random init of ``smollm2_models`` saved into ``folder``."""
    if not random_weights:
        from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir
        model_dir = smollm2_hf_dir()
        cfg, params = load_hf_dir(model_dir, dtype="float32")
        return cfg, params, model_dir
    cfg, params, model = smollm2_models(random_weights=True)
    model.save_pretrained(folder)
    return cfg, params, folder


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
                out[f"{dtype} -> {label}"] = median_seconds(
                    lambda: save_hf_dir(cfg, params, os.path.join(folder, "sync"), dtype=dtype), iters)
    return out


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """"4x128,8x512" -> [(4, 128), (8, 512)]."""
    shapes = []
    for item in text.split(","):
        rows, _, length = item.partition("x")
        if not (rows.isdigit() and length.isdigit() and int(rows) > 0 and int(length) > 1):
            raise SystemExit(f"--shapes entry {item!r} is not ROWSxTOKENS with ROWS >= 1, TOKENS >= 2 (e.g. 4x128)")
        shapes.append((int(rows), int(length)))
    return shapes


def cast_model(cfg, params, dtype: str):
    """(config, params) with params, activations and matmuls in ``dtype``."""
    cfg = cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
    return cfg, jax.tree_util.tree_map(lambda x: x.astype(dtype), params)


def phase_steps(cfg, params, tokens: np.ndarray, chunk_size: int) -> dict[str, Callable[[], None]]:
    """One jitted function per phase of the step, each blocking until done."""
    tokens = jnp.asarray(tokens)
    hidden = jnp.zeros((*tokens.shape[:1], tokens.shape[1] - 1, cfg.hidden_size), jnp_dtype(cfg.compute_dtype))

    def layers(params, tokens):
        out, _ = forward(params, cfg, tokens, return_hidden=True)
        return jnp.mean(out.astype(jnp.float32))

    def head(params, hidden):
        return -jnp.mean(chunked_logprobs_from_hidden(hidden, tokens[:, 1:], params, cfg, chunk_size=chunk_size))

    def whole(params, tokens):
        return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=chunk_size))

    jit = functools.partial(jax.jit, compiler_options=learner_compiler_options(cfg.compute_dtype,
                                                                               jax.default_backend()))
    funcs = {"layers fwd": (jit(layers), tokens), "layers fwd+bwd": (jit(jax.grad(layers)), tokens),
             "head+log-softmax fwd+bwd": (jit(jax.grad(head, argnums=(0, 1))), hidden),
             "whole step fwd+bwd": (jit(jax.grad(whole)), tokens)}
    return {name: (lambda f=f, x=x: jax.block_until_ready(f(params, x))) for name, (f, x) in funcs.items()}


@dataclass
class ShapeResult:
    """One shape and dtype: tokens/s of "jax" and of each "torch-<threads>"; peak RSS of each process."""
    throughput: dict[str, float]
    jax_peak_rss: int
    torch_peak_rss: int | None  # None: torch not run
    torch_pid: int | None  # the torch worker's process id


def best_torch_ratio(throughput: dict[str, float]) -> tuple[str, float]:
    """(fastest torch entry, jax tokens/s / its tokens/s)."""
    best = max((name for name in throughput if name.startswith("torch")), key=throughput.get)
    return best, throughput["jax"] / throughput[best]


def torch_runs(args) -> dict[str, int]:
    """The torch runs of a shape, name -> OpenMP threads: each --torch-threads count on CPU; one run
    on the GPU (threads unused)."""
    if args.torch_device == "cuda":
        return {"torch-cuda": 1}
    return {f"torch-{threads}": threads for threads in args.torch_threads}


def torch_label(name: str) -> str:
    """"torch-2" -> "2 thread(s)", "torch-cuda" -> "cuda"."""
    suffix = name.split("-", 1)[1]
    return suffix if suffix == "cuda" else f"{suffix} thread(s)"


def bench_shape(cfg, params, worker: TorchWorker | None, dtype: str, rows: int, length: int, args) -> ShapeResult:
    """tokens/s of jax (this process) and each torch thread count (``worker``'s process, model in ``dtype``)
    at one shape, in interleaved rounds; prints a line each."""
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, length)).astype(np.int32)
    reset_peak_rss()
    results: dict[str, dict] = {"jax": {}}
    steps = {"jax": jax_step(cfg, params, tokens, args.chunk_size, results["jax"], remat=args.remat)}
    torch_pid = None if worker is None else worker.load(dtype, tokens)
    for name, threads in ({} if worker is None else torch_runs(args)).items():
        results[name] = {}
        steps[name] = worker.step_fn(threads, results[name])
    times = interleaved_times(steps, args.warmup, args.iters)
    throughput = {name: rows * length / statistics.median(t) for name, t in times.items()}
    for name, seconds in times.items():
        remat = "" if results["jax"]["remat"] == "off" else f", remat {results['jax']['remat']}"
        label = f"jax (jit{remat})" if name == "jax" else f"torch ({torch_label(name)})"
        print(f"  {rows}x{length} {label:<28}: {statistics.median(seconds):7.3f} s/step (median of "
              f"{len(seconds)})  {throughput[name]:8.1f} tokens/s  loss {results[name]['loss']:.5f}", flush=True)
    if args.profile:
        phases = interleaved_times(phase_steps(cfg, params, tokens, args.chunk_size), 1, args.iters)
        for name, seconds in phases.items():
            print(f"    phase {name:<26}: {statistics.median(seconds):7.3f} s", flush=True)
    return ShapeResult(throughput, peak_rss_bytes(), None if worker is None else worker.peak_rss(), torch_pid)


def ratio_table(cfg32, params32, hf_dir: str, shapes: list[tuple[int, int]], dtypes: list[str],
                args) -> dict[tuple[str, str], ShapeResult]:
    """Every dtype and shape: JAX here, torch (unless --skip-torch) in a worker process loading ``hf_dir``;
    prints each engine's line, then the table of jax / best torch with each process's peak RSS."""
    table: dict[tuple[str, str], ShapeResult] = {}
    worker = None if args.skip_torch else TorchWorker(hf_dir, args.torch_device)
    try:
        for dtype in dtypes:
            cfg, params = cast_model(cfg32, params32, dtype)
            for rows, length in shapes:
                table[(dtype, f"{rows}x{length}")] = bench_shape(cfg, params, worker, dtype, rows, length, args)
    finally:
        if worker is not None:
            worker.close()
    load = os.getloadavg()
    print(f"\n  jax / best torch, fwd+bwd tokens/s (load average now {load[0]:.1f}, {load[1]:.1f} over 5 min; "
          f"peak RSS of the JAX process and of the torch process):")
    print(f"  {'dtype':<9} {'shape':<8} {'jax tok/s':>10} {'best torch':>11} {'tok/s':>8} {'ratio':>6} "
          f"{'jax RSS':>8} {'torch RSS':>9}")
    for (dtype, shape), result in table.items():
        if worker is None:
            best, torch_tps, ratio, torch_rss = "-", "-", "-", "-"
        else:
            best, ratio_value = best_torch_ratio(result.throughput)
            torch_tps, ratio = f"{result.throughput[best]:.1f}", f"{ratio_value:.2f}x"
            torch_rss = f"{result.torch_peak_rss / 1e9:.2f} GB"
        print(f"  {dtype:<9} {shape:<8} {result.throughput['jax']:10.1f} {best:>11} {torch_tps:>8} {ratio:>6} "
              f"{result.jax_peak_rss / 1e9:5.2f} GB {torch_rss:>9}", flush=True)
    return table


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="4x128,8x512,2x2048", help="comma-separated ROWSxTOKENS batches")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--chunk-size", type=int, default=128)
    parser.add_argument("--remat", choices=("auto", *REMAT_MODES), default="auto",
                        help="what the JAX layers keep for the backward pass (train.remat, models/remat.py); "
                             "auto: the first of off, dots, full whose saved activations fit in a third of the RAM")
    parser.add_argument("--profile", action="store_true", help="also time the phases of the JAX step")
    parser.add_argument("--skip-torch", action="store_true")
    parser.add_argument("--random-weights", action="store_true", help="random init instead of the GGUF weights")
    parser.add_argument("--skip-memory", action="store_true", help="do not report the log-prob head's memory")
    parser.add_argument("--skip-export", action="store_true", help="do not time the weight-sync export")
    # OpenMP threads of torch; the best setting is the reference (on a busy machine 1 thread can win).
    parser.add_argument("--torch-threads", type=int, nargs="+", default=sorted({1, os.cpu_count() or 1}))
    parser.add_argument("--torch-device", choices=("cpu", "cuda"), default="cpu",
                        help="where the torch reference runs: cpu (each --torch-threads count) or cuda (the GPU; "
                             "compare with JAX on the same GPU)")
    args = parser.parse_args(argv)
    shapes = parse_shapes(args.shapes)
    dtypes = args.dtypes.split(",")
    for dtype in dtypes:
        if dtype not in ("float32", "bfloat16"):
            raise SystemExit(f"--dtypes entry {dtype!r} is unknown; valid: float32, bfloat16")

    with tempfile.TemporaryDirectory() as folder:
        cfg32, params32, hf_dir = smollm2_checkpoint(args.random_weights, folder)
        print(f"SmolLM2-135M ({'random' if args.random_weights else 'GGUF'} weights), loss = -mean log pi, "
              f"{args.warmup} warm-up + {args.iters} timed rounds (interleaved; torch in a child process); jax "
              f"{jax.__version__} on {jax.devices()[0].device_kind}, torch on {args.torch_device}, {os.cpu_count()} "
              f"CPUs, load average "
              f"{os.getloadavg()[0]:.1f}", flush=True)
        ratio_table(cfg32, params32, hf_dir, shapes, dtypes, args)

    rows, length = shapes[0]
    for batch, seq in (() if args.skip_memory else ((rows, length), (rows, 8 * length))):
        memory = logprob_head_temp_bytes(cfg32, params32, batch, seq, args.chunk_size)
        print(f"  logprob fwd+bwd temp memory {batch}x{seq} (XLA): chunked({args.chunk_size}) "
              f"{memory['chunked'] / 2**20:7.1f} MiB, naive {memory['naive'] / 2**20:7.1f} MiB "
              f"({memory['naive'] / max(memory['chunked'], 1):.1f}x; full logits "
              f"{batch * seq * cfg32.vocab_size * 4 / 2**20:.0f} MiB)")
    for label, seconds in ({} if args.skip_export else bench_export(cfg32, params32, iters=3)).items():
        print(f"  weight sync save_hf_dir {label:<18}: {seconds:6.3f} s")
    print(f"  load average at the end: {os.getloadavg()[0]:.1f} (other processes share these CPUs)")


if __name__ == "__main__":
    main()
