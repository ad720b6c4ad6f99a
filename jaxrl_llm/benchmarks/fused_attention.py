"""cuDNN's fused causal attention against XLA's, on an NVIDIA GPU: same values, and time.

    python -m jaxrl_llm.benchmarks.fused_attention [--batch 2] [--length 2048] [--iters 20]

One attention layer with SmolLM2-135M's heads (9 query, 3 KV heads of 64) in bfloat16 under a
causal mask with right padding (row 1 ends at 3/4 of the length) and two packed segments (row 0):
the output at every row that sees a key, and the gradients of a loss reading only those rows,
from ``models.fused_attention.cudnn_causal_attention`` and from the XLA path the learner takes
elsewhere (``models.decoder.causal_attention`` with the fused path off), each against a float32
XLA reference; then the median time of a jitted forward+backward of each. Needs a GPU: cuDNN's
kernel exists nowhere else.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import decoder
from jaxrl_llm.models.fused_attention import ENV_SWITCH, cudnn_causal_attention


def padded_packed_mask(batch: int, length: int) -> np.ndarray:
    """[B, T, T]: causal; row 0 two packed segments (halves), the others right-padded at 3/4."""
    slots = np.arange(length)
    causal = slots[None, :] <= slots[:, None]
    masks = []
    for row in range(batch):
        if row == 0:
            segment = np.where(slots < length // 2, 1, 2)
        else:
            segment = np.where(slots < 3 * length // 4, 1, 0)
        masks.append(causal & (segment[:, None] == segment[None, :]) & (segment[None, :] > 0))
    return np.stack(masks)


def xla_attention(q, k, v, visible):
    """The learner's attention with the fused path switched off (the switch is read at trace time)."""
    with mock.patch.dict(os.environ, {ENV_SWITCH: "0"}):
        return decoder.causal_attention(q, k, v, visible)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    if jax.default_backend() != "gpu":
        print(f"fused_attention: needs an NVIDIA GPU (JAX's backend here is {jax.default_backend()!r})",
              file=sys.stderr)
        return 2
    keys = jax.random.split(jax.random.key(0), 4)
    shape_q, shape_kv = (args.batch, args.length, 9, 64), (args.batch, args.length, 3, 64)
    q32, k32, v32 = (jax.random.normal(key, shape) for key, shape in zip(keys, (shape_q, shape_kv, shape_kv)))
    cotangent = jax.random.normal(keys[3], shape_q)
    visible = jnp.asarray(padded_packed_mask(args.batch, args.length))
    has_key = visible.any(-1)[..., None, None]

    def loss(fn):
        return jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(jnp.where(has_key, fn(q, k, v, visible), 0)
                                                                  .astype(jnp.float32) * cotangent), argnums=(0, 1, 2)))

    reference = loss(xla_attention)(q32, k32, v32)
    bf16 = tuple(x.astype(jnp.bfloat16) for x in (q32, k32, v32))
    print(f"device {jax.devices()[0].device_kind}, jax {jax.__version__}, q {shape_q} k/v {shape_kv} bf16")
    steps = {"xla": loss(xla_attention), "cudnn": loss(cudnn_causal_attention)}
    for name, step in steps.items():
        value, grads = step(*bf16)
        errors = [float(jnp.max(jnp.abs(g.astype(jnp.float32) - r)) / jnp.max(jnp.abs(r)))
                  for g, r in zip(grads, reference[1])]
        print(f"  {name:>5} vs float32 XLA: loss rel. error {abs(float(value) / float(reference[0]) - 1):.2e}, "
              f"grad q/k/v max error / max |grad| {errors[0]:.2e} {errors[1]:.2e} {errors[2]:.2e}")
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.iters):  # interleaved
        for name, step in steps.items():
            start = time.perf_counter()
            jax.block_until_ready(step(*bf16))
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    for name, seconds in medians.items():
        print(f"  {name:>5} fwd+bwd: {seconds * 1e3:8.3f} ms (median of {args.iters})")
    print(f"  cudnn speed-up over xla: {medians['xla'] / medians['cudnn']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
