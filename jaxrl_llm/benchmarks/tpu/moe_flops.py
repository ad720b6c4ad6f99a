"""MoE compiled FLOPs against the active FLOPs on a TPU slice: Qwen3-30B-A3B's layers (128 experts, top-8),
4 of them, the experts in the dense and the ragged form (`DecoderConfig.moe_experts`), compiled for
the slice from shapes alone on this CPU machine.

    python -m jaxrl_llm.benchmarks.tpu.moe_flops [--topology v5p-8] [--rows 4] [--length 512] [--forms dense,ragged,auto]
        [--out FILE]

The program: the gradient of sum(log-softmax(logits) at the next tokens) over all params, float32
params, bfloat16 compute, params sharded by `models.sharding`'s rules over a (1, fsdp = chips, 1)
mesh, rows over fsdp (the learner's forward + backward without the optimizer). Its layers are
UNROLLED for the count (`Decoder(unroll_layers=True)`): XLA's ``cost_analysis`` counts a loop body
once, and on TPU ragged_dot compiles to Mosaic kernels (custom calls) that `hlo_cost`'s dot count
does not see, while ``cost_analysis`` counts them. FLOPs per chip x chips over:

  model FLOPs (active) = 6 N_active T + 6 D V T + 12 L H hd sum_t ctx_t   (`common.rl_batch`'s count,
  N_active: the router and the k experts a token uses, the LM head on every token here)

and one MoE block alone, compiled on its own on one chip over one chip's tokens, bfloat16: its gradient
over x and the block's weights against its active FLOPs 3 (2 T D E + 2 T k 3 D F), and its forward
against a third of that. "auto" compiles `models.moe.experts_ragged_dense_grad` for a TPU: the ragged
forward, the dense form's gradient (XLA:TPU computes ragged_dot's weight gradient over all E groups).
Compiled figures are XLA's cost model of the TPU program, an ESTIMATE of the device's work, not a
measurement on a TPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import time
from pathlib import Path

import jax
import jax.numpy as jnp

from jaxrl_llm.benchmarks.common.results import RESULTS_DIR, git_commit
from jaxrl_llm.benchmarks.common.rl_batch import body_params
from jaxrl_llm.benchmarks.tpu.chips import parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.hlo_cost import program_cost
from jaxrl_llm.benchmarks.tpu.shapes import model_shape
from jaxrl_llm.models import init_params
from jaxrl_llm.models.decoder import Decoder, positions_from_segments
from jaxrl_llm.models.moe import moe_mlp, moe_param_shapes
from jaxrl_llm.models.sharding import batch_sharding, make_mesh, param_shardings

FORMS = ("dense", "ragged", "auto")


def model_flops(cfg, rows: int, length: int) -> float:
    """Active model FLOPs of one forward + backward over rows x length tokens (module doc)."""
    tokens = rows * length
    context = rows * length * (length + 1) / 2
    return 6.0 * body_params(cfg) * tokens + 6.0 * cfg.hidden_size * cfg.vocab_size * tokens + (
        12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context)


def block_flops(cfg, tokens: int) -> float:
    """Active FLOPs of one MoE block's forward + backward: router and the k experts' three matmuls."""
    d, e, k, f = cfg.hidden_size, cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
    return 3.0 * (2 * tokens * d * e + 2 * tokens * k * 3 * d * f)


def _loss(params, cfg, tokens):
    segments = jnp.ones(tokens.shape, jnp.int32)
    length = tokens.shape[1]
    visible = jnp.broadcast_to(jnp.tril(jnp.ones((length, length), bool)), (tokens.shape[0], length, length))
    logits, _ = Decoder(cfg, unroll_layers=True).apply({"params": params}, tokens, positions_from_segments(segments),
                                                       visible)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def compile_model(cfg, mesh, rows: int, length: int):
    shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
    shardings = param_shardings(shapes, mesh)
    params = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), shapes, shardings)
    tokens = jax.ShapeDtypeStruct((rows, length), jnp.int32, sharding=batch_sharding(mesh))
    return jax.jit(jax.grad(lambda p, t: _loss(p, cfg, t))).lower(params, tokens).compile()


def compile_block(cfg, form: str, mesh, tokens: int, grad: bool = True):
    """One MoE block (its gradient over x and its weights when ``grad``, else its forward), on one chip."""
    rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    weights = {n: jax.ShapeDtypeStruct(s, jnp.bfloat16, sharding=rep)
               for n, s in moe_param_shapes(cfg.hidden_size, cfg.num_experts, cfg.moe_intermediate_size).items()}
    x = jax.ShapeDtypeStruct((1, tokens, cfg.hidden_size), jnp.bfloat16, sharding=rep)

    def loss(x, w):
        return jnp.sum(moe_mlp(x, w, cfg.num_experts_per_tok, cfg.norm_topk_prob, form=form)[0].astype(jnp.float32))
    return jax.jit(jax.grad(loss, argnums=(0, 1)) if grad else loss).lower(x, weights).compile()


def xla_flops(compiled) -> float:
    cost = compiled.cost_analysis()
    return float((cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"])


def measure(topology: str, rows: int, length: int, layers: int = 4, forms=FORMS, model: bool = True) -> dict:
    spec = parse_slice(topology)
    devices = slice_devices(spec)
    mesh = make_mesh(1, len(devices), 1, devices=devices)
    one_chip = make_mesh(1, 1, 1, devices=devices[:1])
    base = model_shape("qwen3-30b-a3b", layers).with_dtypes(param_dtype="float32", compute_dtype="bfloat16")
    active, block_active = model_flops(base, rows, length), block_flops(base, rows * length // len(devices))
    out = {"topology": topology, "chips": len(devices), "device_kind": devices[0].device_kind, "layers": layers,
           "rows": rows, "length": length, "model_flops_active": active, "block_tokens": rows * length // len(devices),
           "block_flops_active": block_active, "forms": {}}
    for form in forms:
        cfg = dataclasses.replace(base, moe_experts=form)
        start = time.perf_counter()
        compiled = compile_model(cfg, mesh, rows, length) if model else None
        seconds = time.perf_counter() - start
        per_chip = xla_flops(compiled) if model else float("nan")
        block = xla_flops(compile_block(cfg, form, one_chip, out["block_tokens"]))
        block_forward = xla_flops(compile_block(cfg, form, one_chip, out["block_tokens"], grad=False))
        out["forms"][form] = {
            "compile_s": seconds, "xla_flops_per_chip": per_chip, "flops_over_active": per_chip * len(devices) / active,
            "hlo_cost_dot_flops_per_chip": program_cost(compiled.as_text()).flops if model else None,  # no Mosaic
            "block_xla_flops": block, "block_flops_over_active": block / block_active,
            "block_forward_xla_flops": block_forward, "block_forward_over_active": block_forward / (block_active / 3)}
        row = out["forms"][form]
        print(f"{topology} {form}: model {row['flops_over_active']:.3f}x active, one block "
              f"{row['block_flops_over_active']:.3f}x, its forward {row['block_forward_over_active']:.3f}x "
              f"(compiled in {seconds:.0f} s)", flush=True)
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topology", default="v5p-8")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--forms", default=",".join(FORMS), help=f"comma-separated, from {FORMS}")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--blocks-only", action="store_true", help="skip the 4-layer model, compile the blocks")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = {"estimate": "XLA's cost model of the compiled TPU program; no TPU ran it", "commit": git_commit(),
              "jax": jax.__version__, "date": datetime.date.today().isoformat(),
              **measure(args.topology, args.rows, args.length, args.layers, args.forms.split(","),
                         not args.blocks_only)}
    out = Path(args.out) if args.out else RESULTS_DIR / f"moe-flops-{args.topology}-{result['date']}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1, default=float) + "\n")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
