"""One lever of the learner's step at a time, paired in one process.

    python -m jaxrl_llm.benchmarks.learner_levers [--shape 4x128] [--dtype float32] [--iters 5]
        [--variants "remat=off;remat=dots;remat=dots,chunk=64"]

Compiles forward+backward of loss = -mean log pi on a SmolLM2-135M-shaped model (random
weights) once per variant, with the learner's XLA options, and times the variants in turns,
round after round, so a drifting load hits them alike. A variant sets ``remat`` (a
``models.remat`` mode) and ``chunk`` (the log-probs' chunk size). (An ``unroll`` lever, the layer
scan unrolled 2 or 30 layers at a time, measured 1.00x and 0.95x and was dropped with the
patch of flax's scan it needed.) Per
variant it prints the median wall seconds per step, the median CPU seconds per step of this
process (less sensitive to other processes on a shared machine than wall time), the median
per-round ratio to the first variant, XLA's temp memory, and the loss and gradients'
largest difference from the first variant's.
"""
from __future__ import annotations

import argparse
import functools
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.model import SMOLLM2_HF_CONFIG, parse_shapes
from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.models.compile_options import learner_compiler_options
from jaxrl_llm.models.remat import REMAT_MODES

VARIANT_KEYS = {"remat": str, "chunk": int}


def parse_variant(text: str) -> dict:
    """"remat=dots,chunk=64" -> {"remat": "dots", "chunk": 64}."""
    out = {"remat": "off", "chunk": 128}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in VARIANT_KEYS or not value:
            raise SystemExit(f"--variants entry {item!r} is not KEY=VALUE with KEY one of {', '.join(VARIANT_KEYS)}")
        out[key] = VARIANT_KEYS[key](value)
    if out["remat"] not in REMAT_MODES:
        raise SystemExit(f"--variants remat={out['remat']!r} is not one of {', '.join(REMAT_MODES)}")
    return out


def compile_variant(cfg, params, tokens, variant: dict):
    def loss(params, tokens):
        return -jnp.mean(token_logprobs(params, cfg, tokens, chunk_size=variant["chunk"], remat=variant["remat"]))

    options = learner_compiler_options(cfg.compute_dtype, jax.default_backend())
    return jax.jit(jax.value_and_grad(loss), compiler_options=options).lower(params, tokens).compile()


def timed_rounds(steps: dict, warmup: int, iters: int) -> dict[str, list[tuple[float, float]]]:
    """(wall s, process CPU s) of every step in every round, steps in turns."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in steps}
    for _ in range(iters):
        for name, step in steps.items():
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            times[name].append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def max_relative_difference(tree, ref) -> float:
    return max(float(jnp.max(jnp.abs(a - b)) / jnp.max(jnp.abs(b)))
               for a, b in zip(jax.tree_util.tree_leaves(tree), jax.tree_util.tree_leaves(ref)))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="4x128")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--variants", default="remat=off;remat=dots;remat=full")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args(argv)
    (rows, length), = parse_shapes(args.shape)
    variants = {text: parse_variant(text) for text in args.variants.split(";")}
    cfg = DecoderConfig.from_hf(dict(SMOLLM2_HF_CONFIG, architectures=["LlamaForCausalLM"], model_type="llama"))
    cfg = cfg.with_dtypes(param_dtype=args.dtype, compute_dtype=args.dtype)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, length)).astype(np.int32))
    compiled, results, steps = {}, {}, {}
    for name, variant in variants.items():
        start = time.perf_counter()
        compiled[name] = compile_variant(cfg, params, tokens, variant)
        results[name] = (compiled[name](params, tokens), time.perf_counter() - start)
        steps[name] = functools.partial(lambda c: jax.block_until_ready(c(params, tokens)), compiled[name])
    print(f"{args.shape} {args.dtype}, {args.warmup} warm-up + {args.iters} rounds in turns, "
          f"load average {open('/proc/loadavg').read().split()[:3]}", flush=True)
    times = timed_rounds(steps, args.warmup, args.iters)
    base = next(iter(variants))
    (ref_loss, ref_grads), _ = results[base]
    for name in variants:
        (loss, grads), compile_s = results[name]
        wall = statistics.median(t[0] for t in times[name])
        cpu = statistics.median(t[1] for t in times[name])
        ratio = statistics.median(b[0] / t[0] for b, t in zip(times[base], times[name]))
        temp = compiled[name].memory_analysis().temp_size_in_bytes / 2**30
        print(f"  {name:<32} {wall:7.3f} s ({rows * length / wall:6.1f} tok/s)  CPU {cpu:6.2f} s  "
              f"x{ratio:5.3f} vs {base} (per-round median)  temp {temp:5.2f} GiB  compile {compile_s:5.1f} s  "
              f"loss {float(loss):.6f} (diff {abs(float(loss) - float(ref_loss)):.1e}), grads rel diff "
              f"{max_relative_difference(grads, ref_grads):.1e}", flush=True)
        print(f"    rounds (wall, CPU s): {[(round(w, 2), round(c, 2)) for w, c in times[name]]}", flush=True)
    print(f"  load average at the end {open('/proc/loadavg').read().split()[:3]}", flush=True)


if __name__ == "__main__":
    main()
