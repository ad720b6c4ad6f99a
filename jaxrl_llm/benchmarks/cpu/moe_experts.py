"""The MoE block's two expert forms on CPU (`models.moe`): dense (every expert on every token) vs ragged
(grouped matmuls, `jax.lax.ragged_dot`), one block's forward + backward, in one run.

    python -m jaxrl_llm.benchmarks.cpu.moe_experts [--tokens 1024] [--rounds 5] [--out FILE] [--tiny]

Per form: XLA:CPU's compiled FLOPs (``cost_analysis``; the block has no loop, so it counts everything
once) against the active FLOPs by hand, and the median seconds of ``--rounds`` calls taking turns
(`common.timing.interleaved_times`); the ratio ragged / dense of the two in the same run. Shapes:

  small            D 256, F 128, E 16, k 2 (E/k = 8), --tokens tokens, timed
  qwen3-30b-a3b    Qwen3-30B-A3B's layer (D 2048, F 768, E 128, k 8), compiled only (not run)

Active FLOPs of one block's forward: 2 N D E (router) + 2 N k 3 D F (the k experts' three matmuls);
forward + backward: 3 times that. XLA:CPU has no ragged matmul: JAX lowers ragged_dot there to a
masked dense product over all E groups of all N k rows, so on CPU the ragged form costs k times the
dense form, and `DecoderConfig.moe_experts="auto"` takes the dense form there. The TPU figure
(ragged_dot as one instruction) is `benchmarks.tpu.moe_flops`'s.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrl_llm.benchmarks.common.model_shapes import MOE_MODELS
from jaxrl_llm.benchmarks.common.results import RESULTS_DIR, git_commit
from jaxrl_llm.benchmarks.common.timing import interleaved_times
from jaxrl_llm.models.moe import moe_mlp, moe_param_shapes

QWEN3 = MOE_MODELS["qwen3-30b-a3b-4l"]
SHAPES = {"small": dict(hidden=256, width=128, experts=16, top_k=2),
          "qwen3-30b-a3b": dict(hidden=QWEN3["hidden_size"], width=QWEN3["moe_intermediate_size"],
                                experts=QWEN3["num_experts"], top_k=QWEN3["num_experts_per_tok"]),
          "tiny": dict(hidden=64, width=32, experts=4, top_k=2)}
FORMS = ("dense", "ragged")


def active_flops(tokens: int, hidden: int, width: int, experts: int, top_k: int) -> float:
    """Forward + backward matrix FLOPs of one block over `tokens` tokens, only the chosen experts."""
    return 3.0 * (2 * tokens * hidden * experts + 2 * tokens * top_k * 3 * hidden * width)


def block_step(form: str, top_k: int):
    """value_and_grad of sum(y * w) over x and the block's weights, in `form`."""
    def loss(x, weights, w):
        return jnp.sum(moe_mlp(x, weights, top_k, True, form=form)[0] * w)
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))


def block_inputs(tokens: int, hidden: int, width: int, experts: int, abstract: bool = False):
    """(x [1, N, D], weights, w [1, N, D]) float32: random, or ShapeDtypeStructs when `abstract`."""
    shapes = {"x": (1, tokens, hidden), "w": (1, tokens, hidden), **moe_param_shapes(hidden, experts, width)}
    keys = dict(zip(shapes, jax.random.split(jax.random.PRNGKey(0), len(shapes))))
    arrays = {name: jax.ShapeDtypeStruct(shape, jnp.float32) if abstract
              else jax.random.normal(keys[name], shape) * shape[-2] ** -0.5 for name, shape in shapes.items()}
    return arrays["x"], {n: arrays[n] for n in ("router", "expert_gate", "expert_up", "expert_down")}, arrays["w"]


def measure(name: str, tokens: int, rounds: int) -> dict:
    """Compiled FLOPs per form (and seconds per form when rounds > 0) of one block's step."""
    shape = SHAPES[name]
    inputs = block_inputs(tokens, shape["hidden"], shape["width"], shape["experts"], abstract=rounds == 0)
    compiled = {form: block_step(form, shape["top_k"]).lower(*inputs).compile() for form in FORMS}
    active = active_flops(tokens, **shape)
    row = {"shape": name, **shape, "tokens": tokens, "active_flops": active,
           "compiled_flops": {form: c.cost_analysis()["flops"] for form, c in compiled.items()}}
    row["flops_over_active"] = {form: flops / active for form, flops in row["compiled_flops"].items()}
    if rounds:
        times = interleaved_times({form: lambda c=c: jax.block_until_ready(c(*inputs)) for form, c in compiled.items()},
                                  warmup=1, iters=rounds)
        row["seconds"] = {form: statistics.median(t) for form, t in times.items()}
        row["ragged_over_dense_time"] = [r / d for r, d in zip(times["ragged"], times["dense"])]
        row["ragged_over_dense_time_median"] = statistics.median(row["ragged_over_dense_time"])
    return row


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tiny", action="store_true", help="the tiny shape only, 64 tokens, 2 rounds (the test)")
    parser.add_argument("--out", default=None, help=f"JSON file (default: {RESULTS_DIR}/moe-experts-cpu-DATE.json)")
    args = parser.parse_args(argv)
    if args.tiny:
        rows = [measure("tiny", 64, 2)]
    else:
        rows = [measure("small", args.tokens, args.rounds), measure("qwen3-30b-a3b", args.tokens, 0)]
    for row in rows:
        ratios = ", ".join(f"{form} {value:.2f}x" for form, value in row["flops_over_active"].items())
        timed = (f"; time ragged / dense, median of rounds {row['ragged_over_dense_time_median']:.2f}x"
                 if "seconds" in row else " (compiled only)")
        print(f"{row['shape']} (E {row['experts']}, k {row['top_k']}, {row['tokens']} tokens): XLA:CPU FLOPs / active "
              f"{ratios}{timed}")
    result = {"backend": jax.default_backend(), "jax": jax.__version__, "commit": git_commit(),
              "date": datetime.date.today().isoformat(), "cpus": os.cpu_count(), "load_1min_after": os.getloadavg()[0],
              "rows": rows}
    out = Path(args.out) if args.out else RESULTS_DIR / f"moe-experts-cpu-{result['date']}.json"
    if args.out or not args.tiny:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
