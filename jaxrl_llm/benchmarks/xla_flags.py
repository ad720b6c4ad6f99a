"""XLA:CPU compiler options for the learner's step, compared in one process.

    python -m jaxrl_llm.benchmarks.xla_flags [--shape 4x128] [--dtype float32] [--iters 3]
        [--variants default,onednn,...]

The SmolLM2-135M step of ``benchmarks.model`` (fwd+bwd of -mean log pi, random weights)
is lowered once and compiled once per variant with ``compile(compiler_options=...)``
(the per-executable form of the ``XLA_FLAGS=--xla_cpu_...`` debug options), so all
variants run in the same process, on the same buffers, taking turns every round: the
ratio variant / default is immune to the load drifting on a shared machine. Every
variant's loss and gradients are compared with the default build's before timing.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.model import parse_shapes, smollm2_models
from jaxrl_llm.models import token_logprobs

# Option names found in jaxlib 0.10.2 (strings of libjax_common.so); each is an XLA DebugOptions
# field, also settable process-wide as XLA_FLAGS=--<name>=<value>.
VARIANTS: dict[str, dict] = {
    "default": {},
    "onednn": {"xla_cpu_use_onednn": True},
    "xnnpack": {"xla_cpu_use_xnnpack": True},
    "xnn-dot": {"xla_cpu_experimental_xnn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "ynn-dot": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "ynn-dot-eltwise": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE"},
    "ynn-dot-eltwise-reduce": {"xla_cpu_experimental_ynn_fusion_type":
                               "LIBRARY_FUSION_TYPE_DOT,LIBRARY_FUSION_TYPE_ELTWISE,LIBRARY_FUSION_TYPE_REDUCE"},
    "onednn-dot": {"xla_cpu_experimental_onednn_fusion_type": "LIBRARY_FUSION_TYPE_DOT"},
    "eigen-1-thread": {"xla_cpu_multi_thread_eigen": False},
    "vector-256": {"xla_cpu_prefer_vector_width": 256},
    "vector-512": {"xla_cpu_prefer_vector_width": 512},  # AVX-512 CPUs (LLVM's default prefers 256)
    "ynn-dot-vector-512": {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_DOT",
                           "xla_cpu_prefer_vector_width": 512},
    "concurrency-scheduler": {"xla_cpu_enable_concurrency_optimized_scheduler": True},
    "no-fusion-emitters": {"xla_cpu_use_fusion_emitters": False},
}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="4x128")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    parser.add_argument("--chunk-size", type=int, default=128)
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"--variants entry {name!r} is unknown; valid: {', '.join(VARIANTS)}")
    if "default" not in names:
        names.insert(0, "default")
    (rows, length), = parse_shapes(args.shape)

    cfg, params, _ = smollm2_models(random_weights=True)
    cfg = cfg.with_dtypes(param_dtype=args.dtype, compute_dtype=args.dtype)
    params = jax.tree_util.tree_map(lambda x: x.astype(args.dtype), params)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, length)).astype(np.int32))

    def loss(params, tokens):
        return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=args.chunk_size))

    lowered = jax.jit(jax.value_and_grad(loss)).lower(params, tokens)
    print(f"SmolLM2-135M {args.dtype} {rows}x{length}, jax {jax.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    compiled, reference = {}, None
    for name in names:
        start = time.perf_counter()
        try:
            compiled[name] = lowered.compile(compiler_options=VARIANTS[name])
        except Exception as error:  # an option this jaxlib does not take: say so, go on
            print(f"  {name:<22} not compiled: {str(error).splitlines()[0][:160]}", flush=True)
            continue
        value, grads = compiled[name](params, tokens)
        flat = np.concatenate([np.asarray(g, np.float32).ravel() for g in jax.tree_util.tree_leaves(grads)])
        if reference is None:
            reference = (float(value), flat)
        grad_err = float(np.max(np.abs(flat - reference[1])) / (np.max(np.abs(reference[1])) + 1e-30))
        print(f"  {name:<22} compiled in {time.perf_counter() - start:5.1f} s, loss {float(value):.7f} "
              f"(default {reference[0]:.7f}), max |grad - default| / max |grad| {grad_err:.1e}", flush=True)

    times: dict[str, list[float]] = {name: [] for name in compiled}
    for round_index in range(args.iters + 1):  # round 0 warms up
        for name, fn in compiled.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(params, tokens))
            if round_index:
                times[name].append(time.perf_counter() - start)
    base = statistics.median(times["default"])
    print(f"  median s/step of {args.iters} interleaved rounds (load average now {os.getloadavg()[0]:.1f}):")
    for name, seconds in times.items():
        median = statistics.median(seconds)
        paired = statistics.median(b / s for b, s in zip(times["default"], seconds))
        print(f"  {name:<22} {median:7.3f} s  {rows * length / median:7.1f} tokens/s  speed vs default: "
              f"{base / median:5.2f}x of medians, {paired:5.2f}x median of per-round ratios  "
              f"(rounds {' '.join(f'{s:.2f}' for s in seconds)})", flush=True)


if __name__ == "__main__":
    main()
