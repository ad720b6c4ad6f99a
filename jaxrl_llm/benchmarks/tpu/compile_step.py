"""`jaxrl compile`: every program of one RL step of a run's config, compiled for a TPU slice from
shapes only, with the run's mesh (`mesh` section, resolved against the slice's chips) and sharding
rules; one result per program (`analysis.analyse`) and an ESTIMATE of the whole step's time.

The step estimate adds the programs' roofline estimates as one synchronous step runs them: the
prefill, ``rollout.max_tokens`` decode steps per round of slots (ceil(sequences / slots) rounds; the
decode program is one round's loop),
the weight hand-off, the pi_old pass and epochs x mini-batches learner updates.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from jaxrl_llm.benchmarks.tpu.analysis import DoesNotFit, analyse, refusal
from jaxrl_llm.benchmarks.tpu.chips import Slice, parse_slice, slice_devices
from jaxrl_llm.benchmarks.tpu.programs import step_programs
from jaxrl_llm.benchmarks.tpu.shapes import model_shape

REMAT_ORDER = ("off", "dots", "full")  # train.remat="auto": the first whose update fits (models.remat)
AUTO_FRACTION = 0.9  # of the chip's HBM, as models.remat.device_memory_budget


def policy_config(cfg, model: str | None, num_layers: int | None = None):
    """The policy's `DecoderConfig`: a named shape (`shapes.HF_CONFIGS`), else model.source's config.json."""
    if model is not None:
        return model_shape(model, num_layers)
    from jaxrl_llm.models import DecoderConfig
    from jaxrl_llm.train.policy import resolve_model_dir

    model_cfg = DecoderConfig.from_hf(os.path.join(resolve_model_dir(cfg.model.source), "config.json"))
    return model_cfg if num_layers is None else dataclasses.replace(model_cfg, num_layers=num_layers)


def slice_mesh(cfg, spec: Slice):
    """The run's mesh (config `mesh` section, -1 resolved) over the slice's deviceless devices."""
    from jaxrl_llm.models.sharding import make_mesh
    from jaxrl_llm.train.distributed import resolve_mesh_axes

    axes = resolve_mesh_axes(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, device_count=spec.chips)
    return make_mesh(**axes, devices=slice_devices(spec)), axes


def step_estimate(rows: dict[str, dict], cfg) -> dict:
    """Seconds of one synchronous RL step from the programs' roofline estimates (module doc)."""
    decode = rows["sampler_decode_step"]
    rounds = math.ceil(cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt / decode["batch"])
    updates = cfg.train.epochs_per_batch * cfg.train.minibatches_per_batch
    parts = {"prefill_s": rows["sampler_prefill"]["roofline"]["seconds"],
             "decode_s": rounds * cfg.rollout.max_tokens * decode["roofline"]["seconds"] / decode.get("decode_steps", 1),
             "handoff_s": rows["weight_handoff"]["roofline"]["seconds"],
             "pi_old_s": rows["pi_old"]["roofline"]["seconds"],
             "learner_s": updates * rows["learner_update"]["roofline"]["seconds"]}
    return {"estimate": True, **parts, "seconds": sum(parts.values())}


def compile_step(cfg, topology: str, *, model: str | None = None, num_layers: int | None = None,
                 prompt_len: int = 512, refuse: bool = True, log=print, model_cfg=None) -> dict[str, Any]:
    """Compile the RL step of ``cfg`` for ``topology`` and report it (module doc). ``refuse``: raise
    `analysis.DoesNotFit` at the first program that does not fit; else report every program.
    ``model_cfg``: the policy's `DecoderConfig` itself (default: ``model`` or model.source's)."""
    spec = parse_slice(topology)
    mesh, axes = slice_mesh(cfg, spec)
    model_cfg = policy_config(cfg, model, num_layers) if model_cfg is None else model_cfg
    remat = cfg.train.remat
    modes = REMAT_ORDER if remat == "auto" else (remat,)
    rows: dict[str, dict] = {}
    t0 = time.perf_counter()
    for mode in modes:
        programs = step_programs(cfg, model_cfg, mesh, prompt_len=prompt_len, remat=mode)
        last = mode == modes[-1]
        update = analyse(programs[0], spec, refuse=refuse and last)
        needed = update.row.get("hbm_bytes") or math.inf
        if remat != "auto" or last or needed <= AUTO_FRACTION * spec.chip.hbm_bytes:
            break
        log(f"  remat {mode!r}: learner_update needs {needed / 2**30:.2f} GiB > "
            f"{AUTO_FRACTION:.0%} of {spec.chip.hbm_bytes / 2**30:.0f} GiB; trying the next mode")
    rows[update.name] = update.row
    log(_line(update.row, spec))
    for program in programs[1:]:
        report = analyse(program, spec, refuse=refuse)
        rows[report.name] = report.row
        log(_line(report.row, spec))
    fits = all(row["fits"] for row in rows.values())
    result = {"topology": spec.name, "topology_name": spec.topology_name, "chip": spec.chip.generation,
              "chips": spec.chips, "chip_hbm_bytes": spec.chip.hbm_bytes, "mesh": axes,
              "model": model or cfg.model.source, "num_layers": model_cfg.num_layers,
              "params": model_cfg.num_params(), "active_params": model_cfg.num_active_params(),
              "step": {"prompts": cfg.rollout.prompts_per_step, "samples": cfg.rollout.samples_per_prompt,
                       "prompt_len": prompt_len, "new_tokens": cfg.rollout.max_tokens,
                       "precision": cfg.train.precision, "remat": rows["learner_update"].get("remat", mode),
                       "micro_batch_tokens": cfg.train.micro_batch_tokens, "lora_rank": cfg.train.lora_rank,
                       "recipe": cfg.recipe.name, "batch_invariant": cfg.rollout.batch_invariant},
              "fits": fits, "programs": list(rows.values()), "compile_s": round(time.perf_counter() - t0, 1)}
    if fits and all(name in rows for name in ("sampler_decode_step", "sampler_prefill", "weight_handoff", "pi_old")):
        result["step_estimate"] = step_estimate(rows, cfg)
    return result


def _line(row: dict, spec: Slice) -> str:
    if "roofline" not in row:
        return f"  {row['program']:<20} does not fit: XLA ran out of memory ({row.get('hbm_bytes')} bytes)"
    coll = ", ".join(f"{int(v['count'])} {k} ({v['bytes'] / 1e6:.1f} MB)" for k, v in row["collectives"].items())
    return (f"  {row['program']:<20} HBM {row['hbm_bytes'] / 2**30:6.2f} / {spec.chip.hbm_bytes / 2**30:.0f} GiB "
            f"{'fits' if row['fits'] else 'DOES NOT FIT'}; {row['flops'] / 1e9:,.1f} GFLOP, "
            f"{row['hbm_bytes_accessed'] / 1e9:,.2f} GB accessed; est. {row['roofline']['seconds'] * 1e3:,.2f} ms "
            f"({row['roofline']['bound']}-bound); collectives: {coll or 'none'}")


def provenance() -> dict:
    import jax

    from jaxrl_llm.benchmarks.tpu.chips import libtpu_version

    return {"jax": jax.__version__, "libtpu": libtpu_version(),
            "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "cpu_count": os.cpu_count()}


def write_json(path: str | os.PathLike, data: dict) -> Path:
    from jaxrl_llm.utils.atomic_files import write_text_atomic

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(data, indent=1, default=float) + "\n")
    return path


__all__ = ["DoesNotFit", "compile_step", "refusal", "write_json", "provenance"]
