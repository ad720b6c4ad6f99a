"""Compile time of the JAX sampler's decode program on CPU: a proxy anyone can measure without a GPU.

On an H100 the compacting decode (`rollout.jax_sampler._generate`) took 150-185 s to compile for
each new batch size at the Qwen2.5-1.5B shape (12 decode loops x 20 cache-window branches; issue
46); the slot decode (`rollout.decode_slots.generate_slots`) is one loop with no window branch.
`compile_seconds` lowers and compiles either whole program (prefill + decode) for the CPU backend
from abstract arguments (`jax.ShapeDtypeStruct`: no weight is materialised, so a 1.5B shape fits
in a few GB) and times the two phases. CPU compile seconds are not GPU compile seconds; the ratio
of the two paths is the proxy.

Run: ``python -m jaxrl_llm.benchmarks.cpu.sampler_compile --out benchmarks/results/sampler-compile-cpu-DATE.json``
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.benchmarks.common.model_shapes import model_config
from jaxrl_llm.models import param_shapes

SHAPE = "qwen2.5-1.5b"


def _abstract_args(cfg, batch: int, prompt_len: int) -> tuple:
    def spec(shape, dtype):
        return jax.ShapeDtypeStruct(shape, dtype)

    scalar = spec((), jnp.float32)
    return (param_shapes(cfg), cfg, spec((batch, prompt_len), jnp.int32), spec((batch, prompt_len), bool),
            jax.random.key(0), scalar, scalar, spec((1,), jnp.int32), spec((batch,), jnp.int32))


def compile_seconds(path: str, *, shape: str = SHAPE, batch: int = 64, prompt_len: int = 128, new_tokens: int = 512,
                    dtype: str = "bfloat16", num_layers: int | None = None, slots: int | None = None,
                    compactions: int = 12, cache_window: int = 32) -> dict[str, Any]:
    """Seconds to lower and to compile the decode program of ``path`` ("compact" or "slots") for
    ``batch`` distinct prompts of ``prompt_len`` tokens and ``new_tokens`` new tokens at ``shape`` in
    ``dtype`` (``num_layers``: fewer layers than the shape's). "compact" as `JaxSampler` calls it for
    long generations (rows compacted down to 1, `compaction_sizes`, ``cache_window`` slots);
    "slots" with ``slots`` slots (default: batch) and the dense kernel."""
    from jaxrl_llm.rollout.decode_slots import generate_slots
    from jaxrl_llm.rollout.jax_sampler import _generate, compaction_sizes

    cfg = model_config(shape, prompt_len + new_tokens).with_dtypes(param_dtype=dtype, compute_dtype=dtype)
    if num_layers is not None:
        cfg = dataclasses.replace(cfg, num_layers=num_layers)
    args = _abstract_args(cfg, batch, prompt_len)
    options = dict(max_tokens=new_tokens, top_k=None, use_top_p=False)
    t0 = time.perf_counter()
    if path == "compact":
        lowered = _generate.lower(*args, jax.ShapeDtypeStruct((batch,), bool), compactions=compactions, min_rows=1,
                                  cache_window=cache_window, **options)
        structure = {"decode_loops": len(compaction_sizes(batch, 1, compactions)),
                     "cache_window_branches": -(-(prompt_len + new_tokens) // cache_window)}
    elif path == "slots":
        lowered = generate_slots.lower(*args, jax.ShapeDtypeStruct((), jnp.int32), slots=slots or batch,
                                       kernel="dense", **options)
        structure = {"decode_loops": 1, "cache_window_branches": 0, "slots": slots or batch}
    else:
        raise ValueError(f"path {path!r} is not 'compact' or 'slots'")
    lower_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    lowered.compile()
    compile_s = time.perf_counter() - t0
    return {"path": path, "shape": shape, "num_layers": cfg.num_layers, "dtype": dtype, "batch": batch,
            "prompt_len": prompt_len, "new_tokens": new_tokens, **structure, "lower_s": lower_s,
            "compile_s": compile_s, "backend": jax.default_backend(), "loadavg_after": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    parser.add_argument("--paths", default="slots,compact", help="comma-separated: compact, slots")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--num-layers", type=int, default=None, help="fewer layers than the shape's")
    args = parser.parse_args(argv)
    results = {"loadavg_before": list(os.getloadavg()), "cpu_count": os.cpu_count(), "jax": jax.__version__,
               "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "runs": []}
    for path in args.paths.split(","):
        run = compile_seconds(path, batch=args.batch, prompt_len=args.prompt_len, new_tokens=args.new_tokens,
                              num_layers=args.num_layers)
        print(json.dumps(run), flush=True)
        results["runs"].append(run)
        with open(args.out, "w") as f:  # after each path: a killed run keeps what it measured
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
