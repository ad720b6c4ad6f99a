"""Weights all-gathered per decode step, read from the compiled HLO of one slot-decode step for a TPU
slice: in the learner's layout (what the JAX sampler decodes from without ``rollout.mesh``: FSDP over
every chip) and in the sampler's own layouts (`rollout.sampler_mesh`: data x tensor).

An all-gather is a weight's when its result has the shape of a parameter of the sampler's model
(whole, or one layer of a stacked [nL, ...] leaf) in the sampler's dtype; its bytes are the gathered
buffer's, counted as often as it runs (the layer loop's trip count, `hlo_text.trip_count`). All other
collectives come from `hlo_cost.program_cost` beside it. The program is the one `jaxrl compile`
reports as ``sampler_decode_step`` (`programs.sampler_programs`), compiled from shapes only.

    python -m jaxrl_llm.benchmarks.tpu.sampler_gathers --topology v5e-8 --model qwen2.5-1.5b \\
        [--batch 64] [--steps 1] --out benchmarks/results/tpu/sampler-mesh-v5e-8.json
"""
from __future__ import annotations

import argparse
import math
import time
from typing import Any, NamedTuple

import jax

from jaxrl_llm.benchmarks.tpu.chips import parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.compile_step import provenance, write_json
from jaxrl_llm.benchmarks.tpu.hlo_cost import program_cost
from jaxrl_llm.benchmarks.tpu.hlo_text import Computation, attr, called, dims, parse_module, shape_bytes, split_top, \
    trip_count
from jaxrl_llm.benchmarks.tpu.programs import StepShape, sampler_programs
from jaxrl_llm.benchmarks.tpu.shapes import model_shape
from jaxrl_llm.models import make_mesh, param_shapes
from jaxrl_llm.models.platform import compiling_for
from jaxrl_llm.rollout.sampler_mesh import SamplerLayout, sampler_mesh


class Gather(NamedTuple):
    """One all-gather of the program: its result type, bytes, how many times one step runs it, and the size
    of the dimension it gathers."""

    shape: str
    bytes: float
    times: float
    gathered: int


def all_gathers(hlo_text: str) -> list[Gather]:
    """Every all-gather of a compiled program, with how often it runs: while bodies times their trip count
    (unknown: once), every branch of a conditional and every called computation once. One per channel_id:
    TPU's async collective fusions copy a collective into several fused computations (start, continuations,
    done) under its one channel_id, and it runs once."""
    comps = parse_module(hlo_text)
    found: dict[str, Gather] = {}

    def walk(comp: Computation, times: float) -> None:
        for instr in comp.instrs:
            if instr.opcode in ("all-gather", "all-gather-start"):
                result = instr.shape
                if instr.opcode.endswith("-start") and result.startswith("("):
                    parts = split_top(result[1:-1])
                    result = parts[1] if len(parts) > 1 else parts[0]
                key = attr(instr.attrs, "channel_id") or f"{comp.name}/{instr.name}"
                axis = int((attr(instr.attrs, "dimensions") or "{0}").strip("{}").split(",")[0])
                gather = Gather(result.split("{")[0], shape_bytes(result), times, dims(result)[axis])
                if key not in found or found[key].times < times:
                    found[key] = gather
            if instr.opcode == "while":
                trips = trip_count(instr, comps, comp) or 1
                walk(comps[attr(instr.attrs, "body")], times * trips)
                continue
            for name in called(instr):
                if name in comps:
                    walk(comps[name], times)

    walk(comps["__entry__"], 1.0)
    return list(found.values())


def weight_sizes(params_or_shapes: Any) -> set[int]:
    """Element counts a gathered weight matrix can have: each leaf of rank >= 2 whole and, for stacked layer
    leaves, one layer (XLA may gather a weight reshaped or transposed, so shapes are not compared)."""
    sizes = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params_or_shapes)[0]:
        layered = any(getattr(k, "key", None) == "layers" for k in path)
        if leaf.ndim - layered >= 2:
            sizes.add(math.prod(leaf.shape))
            if layered:
                sizes.add(math.prod(leaf.shape[1:]))
    return sizes


def weight_gathers(gathers: list[Gather], sizes: set[int], dtype: str, rows: int) -> dict:
    """Count and bytes (per step) of the all-gathers of a weight matrix: results in ``dtype`` (its HLO name,
    e.g. "bf16") with the element count of one (`weight_sizes`), not gathered along a dimension of ``rows``
    (the decode batch: an activation split by rows, as [256, 1536] at batch 256, which has k_proj's count)."""
    hits = [g for g in gathers if g.shape.startswith(dtype + "[") and math.prod(dims(g.shape)) in sizes
            and g.gathered != rows]
    return {"count": sum(g.times for g in hits), "bytes": sum(g.bytes * g.times for g in hits)}


def decode_step_report(sampler_cfg, shape: StepShape, mesh, layout: SamplerLayout | None, steps: int = 1) -> dict:
    """Compile ``steps`` slot-decode steps in one loop (1: the step alone; learner's layout on ``mesh``, or
    ``layout``) and count its gathers per step (the program's / ``steps``)."""
    t0 = time.perf_counter()
    with compiling_for("tpu"):
        program = sampler_programs(sampler_cfg, shape, mesh, path="slots", kernel="dense", slots=None,
                                   layout=layout, decode_steps=steps)[1]
        try:
            hlo = program.lowered.compile().as_text()
        except jax.errors.JaxRuntimeError as err:  # XLA refuses a program larger than the chip's HBM
            if "RESOURCE_EXHAUSTED" not in str(err):
                raise
            return {"fits": False, "error": str(err).splitlines()[0][:300],
                    "compile_s": round(time.perf_counter() - t0, 1)}
    model_cfg = sampler_cfg if layout is None else layout.model_config(sampler_cfg)
    gathers = all_gathers(hlo)
    weights = weight_gathers(gathers, weight_sizes(param_shapes(model_cfg)), "bf16", shape.sequences)
    cost = program_cost(hlo)
    return {"fits": True, "decode_steps": steps, "weight_all_gathers_per_step": weights["count"] / steps,
            "weight_bytes_all_gathered_per_step": weights["bytes"] / steps,
            "all_gather_bytes_per_step": sum(g.bytes * g.times for g in gathers) / steps,
            "hbm_bytes_accessed_per_step": cost.hbm_bytes / steps,  # per chip
            "collectives": cost.as_dict()["collectives"],
            "largest_all_gathers": sorted({g.shape: g.bytes * g.times for g in gathers}.items(),
                                          key=lambda kv: -kv[1])[:6],
            "sampler_kv_heads": model_cfg.num_kv_heads, "compile_s": round(time.perf_counter() - t0, 1)}


def measure(topology: str = "v5e-8", model: str = "qwen2.5-1.5b", batch: int = 64, prompt_len: int = 512,
            new_tokens: int = 512, meshes: tuple[tuple[int, int], ...] = ((2, 4), (4, 2), (8, 1), (1, 8)),
            steps: int = 1, log=print) -> dict:
    """The decode step of ``model`` (bf16 sampler) at ``batch`` slots over a prompt_len + new_tokens cache on
    ``topology``: the learner's layout (mesh.fsdp = all chips) and each sampler mesh (data, tensor); ``steps``
    steps in one loop (as `generate_slots` runs them: XLA could hoist a gather out of it), counted per step."""
    spec = parse_slice(topology)
    devices = slice_devices(spec)
    model_cfg = model_shape(model)
    sampler_cfg = model_cfg.with_dtypes(param_dtype="bfloat16", compute_dtype="bfloat16")
    shape = StepShape(prompts=batch // 8, samples=8, prompt_len=prompt_len, new_tokens=new_tokens)
    weight_bytes = sum(math.prod(x.shape) * 2 for x in jax.tree.leaves(param_shapes(sampler_cfg)))
    rows = {}
    learner = make_mesh(fsdp=-1, devices=devices)
    rows[f"learner fsdp={spec.chips}"] = {"mesh": {"fsdp": spec.chips},
                                          **decode_step_report(sampler_cfg, shape, learner, None, steps)}
    log(_line(f"learner fsdp={spec.chips}", rows[f"learner fsdp={spec.chips}"]))
    for data, tensor in meshes:
        layout = SamplerLayout.plan(sampler_cfg, sampler_mesh(data, tensor, devices=devices), "slots")
        name = f"sampler data={data} tensor={tensor}"
        rows[name] = {"mesh": {"data": data, "tensor": tensor}, "kv_repeat": layout.kv_repeat,
                      "heads_split": layout.split_heads, "slots_split": layout.split_slots,
                      **decode_step_report(sampler_cfg, shape, learner, layout, steps)}
        log(_line(name, rows[name]))
    return {"what": "weights all-gathered per slot-decode step, from the compiled HLO (deviceless TPU compile)",
            "topology": spec.name, "model": model, "sampler_dtype": "bfloat16", "batch": batch, "decode_steps": steps,
            "cache_slots": prompt_len + new_tokens, "weight_bytes": weight_bytes,
            "layouts": rows, "provenance": provenance()}


def _line(name: str, row: dict) -> str:
    if not row["fits"]:
        return f"{name:28s} does not fit: {row['error']}"
    return (f"{name:28s} weights all-gathered per step: {row['weight_bytes_all_gathered_per_step'] / 2**20:9.1f} MiB "
            f"({row['weight_all_gathers_per_step']:.0f} gathers); all all-gathers "
            f"{row['all_gather_bytes_per_step'] / 2**20:9.1f} MiB; compiled in {row['compile_s']} s")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topology", default="v5e-8")
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1, help="decode steps in one loop (1: the step alone)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    result = measure(args.topology, args.model, args.batch, steps=args.steps)
    if args.out:
        print(f"wrote {write_json(args.out, result)}")


if __name__ == "__main__":
    main()
