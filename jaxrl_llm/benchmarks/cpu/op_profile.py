"""Where one learner step's time goes, per XLA op.

    python -m jaxrl_llm.benchmarks.cpu.op_profile [--layers 30] [--shape 4x128] [--remat off|dots|full]
        [--dtype float32|bfloat16] [--default-options] [--top 30] [--tiny]

Traces two forward+backward steps of loss = -mean log pi on a SmolLM2-135M-shaped model
(random weights, float32 or ``--dtype``) with ``jax.profiler``, reads the trace with
``jax.profiler.ProfileData`` (no TensorBoard needed), sums every op's time over XLA:CPU's
worker threads (CPU-seconds per step) and names it by its HLO metadata (forward or backward,
the JAX operation, the output shape). ``--default-options`` compiles without the learner's
XLA options (``models.compile_options``), for a before/after; ``--remat`` picks what the layers
keep for the backward pass (``models.remat``, as ``train.remat``). ``--tiny`` (``make bench-op-profile
BENCH_ARGS=--tiny``, the tests): 2 layers of hidden 64 over a 512-token vocabulary, one 2x16 batch.
"""
from __future__ import annotations

import argparse
import collections
import glob
import re
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.cpu.model import SMOLLM2_HF_CONFIG, parse_shapes
from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.models.compile_options import learner_compiler_options
from jaxrl_llm.models.remat import REMAT_MODES


def hlo_op_labels(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> "fwd|bwd <jax op name> -> <output shape>" from its metadata."""
    labels = {}
    for line in hlo_text.splitlines():
        match = re.match(r'\s*(?:ROOT )?%([\w.\-]+) = (\S+) .*?metadata=\{[^}]*op_name="([^"]*)"', line)
        if match:
            name, shape, op = match.groups()
            phase = "bwd" if "transpose(" in op else "fwd"
            labels[name] = f"{phase} {re.sub(r'^jit[(][^)]*[)]/', '', op)[-100:]} -> {shape.split('{')[0]}"
    return labels


def op_seconds(trace_dir: str, steps: int) -> collections.Counter:
    """CPU-seconds per step of every op event on XLA:CPU's threads (its worker pool, and the
    client thread that runs small ops itself)."""
    path = glob.glob(f"{trace_dir}/**/*.xplane.pb", recursive=True)[0]
    totals: collections.Counter = collections.Counter()
    for plane in jax.profiler.ProfileData.from_file(path).planes:
        for line in plane.lines:
            if not line.name.startswith(("tf_XLAEigen", "tf_XLAPjRtCpuClient")):
                continue
            for event in line.events:
                if not event.name.startswith(("ThunkExecutor", "SlinkyThreadPool", "ThreadpoolListener", "end: ")):
                    totals[event.name] += event.duration_ns / 1e9 / steps
    return totals


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--shape", default="4x128")
    parser.add_argument("--default-options", action="store_true", help="compile without the learner's XLA options")
    parser.add_argument("--remat", choices=REMAT_MODES, default="off")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                        help="params, activations and matmuls (as bench-model's dtypes)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--by-kind", action="store_true",
                        help="also sum the ops by kind (the op name without its number: ynn_fusion = YNNPACK dots)")
    parser.add_argument("--tiny", action="store_true", help="2 small layers, one 2x16 batch")
    args = parser.parse_args(argv)
    hf_config = dict(SMOLLM2_HF_CONFIG, num_hidden_layers=args.layers)
    if args.tiny:
        args.shape = "2x16"
        hf_config.update(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    (rows, length), = parse_shapes(args.shape)
    cfg = DecoderConfig.from_hf(dict(hf_config, architectures=["LlamaForCausalLM"], model_type="llama"))
    cfg = cfg.with_dtypes(param_dtype=args.dtype, compute_dtype=args.dtype)
    params = init_params(cfg, jax.random.PRNGKey(0))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab_size, (rows, length)).astype(np.int32))
    options = None if args.default_options else learner_compiler_options(args.dtype, jax.default_backend())
    loss = lambda p, t: -jnp.mean(token_logprobs(p, cfg, t, remat=args.remat))  # noqa: E731
    step = jax.jit(jax.value_and_grad(loss), compiler_options=options)
    labels = hlo_op_labels(step.lower(params, tokens).compile().as_text())
    jax.block_until_ready(step(params, tokens))
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        for _ in range(2):
            jax.block_until_ready(step(params, tokens))
        jax.profiler.stop_trace()
        seconds = op_seconds(trace_dir, steps=2)
    total = sum(seconds.values())
    print(f"{cfg.num_layers} layers, {rows}x{length} {args.dtype}, remat {args.remat}, options {options}: "
          f"{total:.3f} CPU-s in ops per step")
    for name, value in seconds.most_common(args.top):
        print(f"  {value:7.3f} s {100 * value / total:5.1f}%  {name:<24} {labels.get(name, '?')}")
    if args.by_kind:
        print("by kind:")
        for kind, (value, count) in sorted(seconds_by_kind(seconds).items(), key=lambda item: -item[1][0])[:args.top]:
            print(f"  {value:7.3f} s {100 * value / total:5.1f}%  {kind:<32} {count} ops")
    return {"cfg": cfg, "rows": rows, "length": length, "seconds": seconds, "labels": labels}


def seconds_by_kind(seconds: collections.Counter) -> dict[str, tuple[float, int]]:
    """op kind (its name without the trailing .N) -> (seconds, number of ops)."""
    kinds: dict[str, tuple[float, int]] = {}
    for name, value in seconds.items():
        kind = re.sub(r"\.\d+$", "", name)
        old_value, old_count = kinds.get(kind, (0.0, 0))
        kinds[kind] = (old_value + value, old_count + 1)
    return kinds


if __name__ == "__main__":
    main()
