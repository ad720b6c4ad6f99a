"""Does XLA:CPU have a bfloat16 matmul faster than its float32 one? GFLOP/s of one dot, per dtype and XLA option.

    python -m jaxrl_llm.benchmarks.bf16_dot [--rows 512,4096] [--iters 20] [--variants default,ynn-dot,...]
        [--skip-torch]

The learner's matmuls at SmolLM2-135M's MLP shapes (``rows`` = batch x tokens): forward
x[rows, 576] @ w[576, 1536], and the two of the backward pass, dx = dy[rows, 1536] @ w^T and
dw = x^T @ dy (contracting over the rows). Each in three kinds: float32; bfloat16 x bfloat16
-> bfloat16 (what ``models.decoder`` computes in bfloat16); bfloat16 x bfloat16 accumulated
and returned in float32 (``preferred_element_type=float32``, what a native bf16 dot
instruction such as AVX512_BF16's vdpbf16ps computes). Every kind is compiled once per XLA
option set of ``benchmarks.xla_flags`` and the builds take turns every round (median of
``iters``). torch's matmul on the same operands, at all threads, is the reference: it
reaches oneDNN's bf16 kernels where the CPU has them.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.xla_flags import VARIANTS

HIDDEN, MLP = 576, 1536  # SmolLM2-135M hidden and MLP widths
KINDS = {"f32": (jnp.float32, None), "bf16": (jnp.bfloat16, None), "bf16->f32": (jnp.bfloat16, jnp.float32)}


def dot_shapes(rows: int) -> dict[str, tuple[tuple[int, int], tuple[int, int], tuple]]:
    """name -> (lhs shape, rhs shape, dot_general dimension numbers)."""
    plain = (((1,), (0,)), ((), ()))
    return {"fwd x@w": ((rows, HIDDEN), (HIDDEN, MLP), plain),
            "bwd dy@w^T": ((rows, MLP), (HIDDEN, MLP), (((1,), (1,)), ((), ()))),
            "bwd x^T@dy": ((rows, HIDDEN), (rows, MLP), (((0,), (0,)), ((), ())))}


def dot_flops(lhs: tuple[int, int], rhs: tuple[int, int], dims) -> int:
    """2 x (output elements) x (contracted length)."""
    (contract_lhs,), _ = dims[0]
    free_lhs = lhs[1 - contract_lhs]
    free_rhs = rhs[1 - dims[0][1][0]]
    return 2 * free_lhs * free_rhs * lhs[contract_lhs]


def compiled_dot(lhs, rhs, dims, preferred, options: dict):
    def dot(a, b):
        return jax.lax.dot_general(a, b, dims, preferred_element_type=preferred)
    return jax.jit(dot).lower(lhs, rhs).compile(compiler_options=options or None)


def torch_dot(lhs: np.ndarray, rhs: np.ndarray, dims, dtype: str):
    import torch
    a = torch.tensor(lhs, dtype=getattr(torch, dtype))
    b = torch.tensor(rhs, dtype=getattr(torch, dtype))
    a = a.T if dims[0][0] == (0,) else a
    b = b.T if dims[0][1] == (1,) else b
    return lambda: torch.matmul(a, b)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="512,4096", help="comma-separated rows (batch x tokens)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--variants", default="default,ynn-dot,xnn-dot,onednn,onednn-dot,vector-512")
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args(argv)
    names = args.variants.split(",")
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"--variants entry {name!r} is unknown; valid: {', '.join(VARIANTS)}")
    print(f"jax {jax.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}", flush=True)
    rng = np.random.default_rng(0)
    for rows in (int(r) for r in args.rows.split(",")):
        for shape_name, (lhs_shape, rhs_shape, dims) in dot_shapes(rows).items():
            lhs, rhs = rng.standard_normal(lhs_shape, np.float32), rng.standard_normal(rhs_shape, np.float32)
            steps, reference = {}, None
            for kind, (dtype, preferred) in KINDS.items():
                a, b = jnp.asarray(lhs, dtype), jnp.asarray(rhs, dtype)
                for name in names:
                    try:
                        fn = compiled_dot(a, b, dims, preferred, VARIANTS[name])
                    except Exception as error:  # an option this jaxlib does not take
                        print(f"  {kind} {name}: not compiled: {str(error).splitlines()[0][:120]}")
                        continue
                    out = np.asarray(fn(a, b), np.float32)
                    reference = out if reference is None else reference
                    err = float(np.max(np.abs(out - reference)) / np.max(np.abs(reference)))
                    steps[f"{kind:<9} {name:<11} (err {err:.1e})"] = (lambda fn=fn, a=a, b=b:
                                                                      jax.block_until_ready(fn(a, b)))
            if not args.skip_torch:
                import torch
                torch.set_num_threads(os.cpu_count() or 1)
                for dtype in ("float32", "bfloat16"):
                    steps[f"torch {dtype:<21}"] = torch_dot(lhs, rhs, dims, dtype)
            times = {name: [] for name in steps}
            for round_index in range(args.iters + 1):  # round 0 warms up
                for name, step in steps.items():
                    start = time.perf_counter()
                    step()
                    if round_index:
                        times[name].append(time.perf_counter() - start)
            flops = dot_flops(lhs_shape, rhs_shape, dims)
            base = statistics.median(times[next(iter(times))])
            print(f" {shape_name} {lhs_shape}x{rhs_shape} ({flops / 1e9:.2f} GFLOP), median of {args.iters}, "
                  f"load {os.getloadavg()[0]:.1f}:", flush=True)
            for name, seconds in times.items():
                median = statistics.median(seconds)
                print(f"   {name:<36} {median * 1e3:7.2f} ms {flops / median / 1e9:7.1f} GFLOP/s "
                      f"{base / median:5.2f}x f32-default", flush=True)


if __name__ == "__main__":
    main()
