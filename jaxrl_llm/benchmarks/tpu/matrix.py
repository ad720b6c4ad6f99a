"""`make tpu-compile`: the RL step of four models compiled for TPU slices, plus the compiled
programs' efficiency figures, into one results file rewritten after every cell (a rerun resumes).

The step: GRPO, 8 prompts x 8 samples, 512-token prompts and 512 new tokens (the GPU benchmarks'
1.5B step: 64 x 512 new tokens, 64k token slots per learner step), bf16 compute with float32 master
weights, remat "full" (the least memory), micro-batches of 8192 token slots (8 rows x 1024). Scaled
for slices of more chips so that every chip holds whole rows: prompts per step = max(8, chips),
micro-batch tokens = max(8192, chips x 1024).

Smallest slice (the documented rule): per model, the slices of `SLICE_ORDER` are tried from the fewest
chips (then the least HBM per slice) until the whole step fits; the ones before it are refused by
the compile (each row names the program and the bytes), the rest are not compiled. The mesh there
is the project's default (`mesh` section: data 1, fsdp -1, tensor 1: parameters, gradients and
optimiser state FSDP-sharded over every chip, batch rows split over them).

Efficiency (`efficiency` cells):
* decode bytes ratio, Qwen2.5-1.5B on v5e-8: a decode step's HBM bytes counted through loops (512 steps
  in one loop, as the sampler runs them, / 512), summed over the chips, / (the bf16 weights + the KV
  cache of the batch's 1024 slots, each read once), at
  batch 64 and 256, slot and compact decode, in the learner's layout (FSDP over 8 chips) and on the
  sampler's own mesh (``rollout.mesh`` data 2 x tensor 4; for the slot decode also data 1 x tensor 8,
  where the weights are read once in all and the cache, split by slots, once);
* learner FLOPs ratio, Qwen2.5-1.5B on v5p-8: the learner update's matrix FLOPs counted through loops,
  summed over the chips, / model FLOPs (6 x weights in matmuls x tokens, the LM head on completion
  tokens only, + 12 x layers x heads x head_dim x the causal context of every token), per remat mode.

Jobs: each model's smallest-slice search (its cells in `SLICE_ORDER`, stopping at the first that fits;
Qwen2.5-1.5B's then goes on to the fp16 and batch-invariant variants on its slice) and each efficiency
cell is one job; ``--jobs N`` processes (default: one per CPU core) take them longest first (`JOBS`'
order, from a quiet run's CPU seconds), so the compiles of both cores overlap. Every cell records its
wall and CPU seconds and the load average when it ended; the file's ``runs`` record each run's wall
and CPU seconds, the load average sampled through it and the cells it compiled (a rerun resumes).

Run: ``python -m jaxrl_llm.benchmarks.tpu.matrix [--out FILE] [--only CELL ...] [--jobs N]``; ``--table``
rewrites docs/benchmarks.md's TPU table from the results file.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import resource
import time
from pathlib import Path
from typing import NamedTuple

from jaxrl_llm.benchmarks.common.results import RESULTS_DIR, git_commit
from jaxrl_llm.benchmarks.tpu.analysis import DoesNotFit, NotCompilable
from jaxrl_llm.benchmarks.tpu.chips import parse_slice
from jaxrl_llm.benchmarks.tpu.compile_step import compile_step, provenance, write_json
from jaxrl_llm.benchmarks.tpu.shapes import model_shape

MODELS = ("qwen2.5-1.5b", "qwen2.5-7b", "qwen2.5-32b", "qwen3-30b-a3b")
# fewest chips first, then the least HBM per slice (v4-8: 4 x 32 GiB; v5p-8: 4 x 95 GiB; ...)
SLICE_ORDER = ("v4-8", "v5p-8", "v5e-8", "v6e-8", "v5p-64", "v5e-256", "v6e-256")
PROMPT_LEN, NEW_TOKENS, SAMPLES, WIDTH = 512, 512, 8, 1024
DEFAULT_OUT = RESULTS_DIR / "tpu" / "tpu-compile-matrix.json"


def step_overrides(chips: int, **extra: str) -> list[str]:
    """The matrix's step for a slice of ``chips`` chips (module doc), as `jaxrl compile` overrides."""
    prompts = max(8, chips)
    values = {"recipe.name": "grpo", "rollout.prompts_per_step": prompts, "rollout.samples_per_prompt": SAMPLES,
              "rollout.max_tokens": NEW_TOKENS, "train.precision": "bf16", "train.remat": "full",
              "train.micro_batch_tokens": max(8192, chips * WIDTH), **extra}
    return [f"{k}={v}" for k, v in values.items()]


def _config(overrides: list[str]):
    from jaxrl_llm.train.config.schema import Config, apply_overrides

    return apply_overrides(Config(name="tpu-compile"), overrides)


def compile_cell(model: str, topology: str, log=None, **extra: str) -> dict:
    """One cell: the step of ``model`` on ``topology``; a refusal is a result ({"fits": false, "refusal": ...})."""
    spec = parse_slice(topology)
    overrides = step_overrides(spec.chips, **extra)
    try:
        result = compile_step(_config(overrides), topology, model=model, prompt_len=PROMPT_LEN, log=log or _log)
    except (DoesNotFit, NotCompilable) as err:
        result = {"topology": topology, "chips": spec.chips, "chip": spec.chip.generation, "fits": False,
                  "refusal": str(err)}
    except Exception as err:  # noqa: BLE001 - a cell that cannot compile is a result: the reason is recorded
        result = {"topology": topology, "chips": spec.chips, "chip": spec.chip.generation, "fits": False,
                  "error": f"{type(err).__name__}: {' '.join(str(err).split())[:400]}"}
    return {"model": model, "overrides": overrides, **result}


def _log(line: str) -> None:
    print(line, flush=True)


def decode_ratio(path: str, batch: int, layout: tuple[int, int] | None) -> dict:
    """The decode step's compiled HBM bytes (all chips) / ideal bytes, Qwen2.5-1.5B on v5e-8 (module doc),
    in the learner's layout (``layout`` None) or on ``rollout.mesh`` (data, tensor)."""
    from jaxrl_llm.benchmarks.tpu.analysis import analyse
    from jaxrl_llm.benchmarks.tpu.compile_step import slice_mesh
    from jaxrl_llm.benchmarks.tpu.programs import StepShape, sampler_layout, sampler_programs
    from jaxrl_llm.models.platform import compiling_for

    spec = parse_slice("v5e-8")
    mesh_overrides = {} if layout is None else {"rollout.mesh.data": layout[0], "rollout.mesh.tensor": layout[1]}
    cfg = _config(step_overrides(spec.chips, **mesh_overrides))
    mesh, axes = slice_mesh(cfg, spec)
    model = model_shape("qwen2.5-1.5b").with_dtypes(param_dtype="bfloat16", compute_dtype="bfloat16")
    shape = StepShape(batch // SAMPLES, SAMPLES, PROMPT_LEN, NEW_TOKENS)
    with compiling_for("tpu"):
        plan = sampler_layout(cfg.rollout.mesh, model, mesh, decode=path)
        programs = sampler_programs(model, shape, mesh, path=path, kernel="dense", slots=batch, layout=plan,
                                    decode_steps=NEW_TOKENS)
    row = analyse(programs[1], spec, refuse=False).row
    kv = 2 * model.num_layers * batch * row["cache_slots"] * model.num_kv_heads * model.head_dim * 2
    weights = 2 * model.num_params()
    compiled = row["hbm_bytes_accessed"] * spec.chips / row["decode_steps"]  # per step, all chips
    return {"metric": "decode_bytes_ratio", "model": "qwen2.5-1.5b", "topology": spec.name,
            "layout": row["sampler_layout"], "path": path, "batch": batch, "cache_slots": row["cache_slots"],
            "ideal_bytes": weights + kv, "compiled_bytes_all_chips": compiled, "ratio": compiled / (weights + kv),
            "all_gather_bytes_per_chip": row["collectives"].get("all-gather", {}).get("bytes", 0.0) / row["decode_steps"],
            "goal": 1.25, "program": row}


def model_flops(model, sequences: int, width: int, completion: int) -> float:
    """Model FLOPs of one forward + backward over ``sequences`` full rows (module doc)."""
    d, hd = model.hidden_size, model.head_dim
    experts = model.num_experts_per_tok if model.is_moe else 1
    width_mlp = model.moe_intermediate_size if model.is_moe else model.intermediate_size
    layer = d * hd * (model.num_heads + 2 * model.num_kv_heads) + model.num_heads * hd * d + 3 * d * width_mlp * experts
    tokens = sequences * width
    context = sequences * width * (width + 1) / 2
    return (6.0 * model.num_layers * layer * tokens + 6.0 * d * model.vocab_size * sequences * completion
            + 12.0 * model.num_layers * model.num_heads * hd * context)


def learner_ratio(remat: str, micro_batch_tokens: int = 4096) -> dict:
    """The learner update's compiled matrix FLOPs (all chips) / model FLOPs, Qwen2.5-1.5B on v5p-8."""
    from jaxrl_llm.benchmarks.tpu.analysis import analyse
    from jaxrl_llm.benchmarks.tpu.compile_step import slice_mesh
    from jaxrl_llm.benchmarks.tpu.programs import step_programs

    spec = parse_slice("v5p-8")
    cfg = _config(step_overrides(spec.chips, **{"train.remat": remat, "train.micro_batch_tokens": micro_batch_tokens}))
    mesh, axes = slice_mesh(cfg, spec)
    model = model_shape("qwen2.5-1.5b")
    update = step_programs(cfg, model, mesh, prompt_len=PROMPT_LEN, remat=remat)[0]
    row = analyse(update, spec, refuse=False).row
    sequences = cfg.rollout.prompts_per_step * SAMPLES
    ideal = model_flops(model, sequences, WIDTH, NEW_TOKENS)
    compiled = row.get("flops", math.nan) * spec.chips
    return {"metric": "learner_flops_ratio", "model": "qwen2.5-1.5b", "topology": spec.name, "mesh": axes,
            "remat": remat, "micro_batch_tokens": micro_batch_tokens, "sequences": sequences,
            "model_flops": ideal, "compiled_flops_all_chips": compiled, "ratio": compiled / ideal,
            "fits": row["fits"], "hbm_bytes": row.get("hbm_bytes"),
            "goal": {"off": 1.10, "full": 1.40}.get(remat), "program": row}


def efficiency_keys() -> list[str]:
    """The efficiency cells (module doc): decode per path x layout x batch, learner per remat mode."""
    layouts = {"slots": ("learner", "d2t4", "d1t8"), "compact": ("learner", "d2t4")}
    decode = [f"efficiency:decode:{path}:{batch}:{layout}" for path, names in layouts.items()
              for layout in names for batch in (64, 256)]
    return decode + [f"efficiency:learner:{mode}" for mode in ("off", "dots", "full")]


def efficiency_cell(key: str) -> dict:
    """The efficiency cell named ``key`` (an `efficiency_keys` entry)."""
    parts = key.split(":")
    if parts[1] == "learner":
        return learner_ratio(parts[2])
    layout = None if parts[4] == "learner" else (int(parts[4][1]), int(parts[4][3]))
    return decode_ratio(parts[2], int(parts[3]), layout)


class Job(NamedTuple):
    """What one worker runs: a model's smallest-slice search (``model``) or one efficiency cell (``key``)."""

    name: str
    model: str | None = None
    key: str | None = None


# Longest first (CPU seconds of each job in a quiet run, so two workers finish together): the
# smallest-slice searches, then the learner's efficiency cells, then the decode ones.
JOBS = ([Job(f"step:{m}", model=m) for m in ("qwen3-30b-a3b", "qwen2.5-7b", "qwen2.5-32b", "qwen2.5-1.5b")]
        + [Job(key, key=key) for key in efficiency_keys()[10:] + efficiency_keys()[:10][::-1]])


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _record(out: Path, only: list[str] | None, key: str, make, made: list[str] | None = None) -> dict:
    """Cell ``key`` from ``out``, else made now (``make()``), timed and merged into ``out`` (its key appended
    to ``made``)."""
    cells = _read(out).get("cells", {})
    if key in cells or (only and not any(key.startswith(o) for o in only)):
        return cells.get(key, {})
    print(f"== {key}", flush=True)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    cell = make()
    cell.update(wall_s=round(time.perf_counter() - t0, 1), cpu_s=round(_cpu_s() - cpu0, 1),
                load_avg_at_end=[round(x, 2) for x in os.getloadavg()])
    print(f"== {key}: {cell['wall_s']} s wall, {cell['cpu_s']} s CPU", flush=True)
    _merge(out, {key: cell})
    if made is not None:
        made.append(key)
    return cell


def run_job(out: Path, only: list[str] | None, job: Job) -> list[str]:
    """One job's cells not yet in ``out`` (module doc): a model's slices in order until one fits (the
    rest are not compiled), Qwen2.5-1.5B's variants on its smallest slice; or one efficiency cell.
    Returns the keys of the cells it made."""
    made: list[str] = []
    if job.key is not None:
        _record(out, only, job.key, lambda: efficiency_cell(job.key), made)
        return made
    smallest = None
    for topology in SLICE_ORDER:
        key = f"step:{job.model}:{topology}"
        if _record(out, only, key, lambda t=topology: compile_cell(job.model, t, log=_prefixed(key)), made).get("fits"):
            smallest = topology
            break
    if job.model == "qwen2.5-1.5b" and smallest is not None:
        for name, extra in (("fp16", {"train.precision": "fp16"}), ("batch_invariant", {"rollout.batch_invariant": "true"})):
            key = f"variant:{name}:{job.model}:{smallest}"
            _record(out, only, key, lambda k=key, e=extra: compile_cell(job.model, smallest, log=_prefixed(k), **e), made)
    return made


def _prefixed(key: str):
    return lambda line: print(f"[{key}] {line}", flush=True)


def run(out: Path, only: list[str] | None = None, jobs: int = 1) -> dict:
    """Every cell not yet in ``out`` (a rerun resumes), the file rewritten after each, by ``jobs``
    worker processes (1: this process). Several processes may share ``out`` (e.g. one per ``--only``
    prefix): each write merges its cell into the file's. A run that compiled a cell records itself in
    ``runs`` (wall and CPU seconds of the run and its workers, load average sampled every 10 s, its cells)."""
    t0, load = time.perf_counter(), _LoadSampler()
    failed, new = [], []
    if jobs <= 1:
        for job in JOBS:
            new += run_job(out, only, job)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # a fresh process per job (about 1 s to start): a worker's memory (GBs after a large compile) is freed
        # when its job ends, not held while the other worker finishes the longest job
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn"), max_tasks_per_child=1) as pool:
            futures = [pool.submit(run_job, out, only, job) for job in JOBS]
            for job, future in zip(JOBS, futures):
                try:
                    new += future.result()
                except Exception as err:  # noqa: BLE001 - the other jobs' cells are kept; reported below
                    failed.append(f"{job.name}: {type(err).__name__}: {err}")
    data, load_avg = _read(out), load.stop()
    if new:
        cells = data["cells"]
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        data = _merge(out, {}, runs=[{
            "wall_s": round(time.perf_counter() - t0, 1), "jobs": jobs, "cells_compiled": len(new),
            "cpu_s": round(own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime, 1),
            "cells_cpu_s_sum": round(sum(cells[k].get("cpu_s", 0.0) for k in new), 1),
            "cells_wall_s_sum": round(sum(cells[k].get("wall_s", 0.0) for k in new), 1),
            "load_avg_1min": load_avg, "nice": os.nice(0), "complete": len(new) == len(cells) and not data["missing"],
            "commit": git_commit(), "cells": sorted(new)}])
    if failed:
        raise RuntimeError("jobs failed: " + "; ".join(failed))
    return data


class _LoadSampler:
    """The 1-minute load average every ``every`` seconds in a thread, until `stop` (mean, max, samples)."""

    def __init__(self, every: float = 10.0):
        import threading

        self.samples = [os.getloadavg()[0]]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, args=(every,), daemon=True)
        self._thread.start()

    def _loop(self, every: float) -> None:
        while not self._done.wait(every):
            self.samples.append(os.getloadavg()[0])

    def stop(self) -> dict:
        self._done.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return {"mean": round(sum(self.samples) / len(self.samples), 2), "max": round(max(self.samples), 2),
                "samples": len(self.samples)}


def _read(out: Path) -> dict:
    return json.loads(out.read_text()) if out.exists() else {}


def _merge(out: Path, cells: dict, **fields) -> dict:
    """The results file with ``cells`` (and top-level ``fields``) added, under a lock (several processes
    may write it)."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = _read(out)
        data.update(provenance(), commit=git_commit(), step={"prompt_len": PROMPT_LEN, "new_tokens": NEW_TOKENS,
                                                             "samples": SAMPLES, "rule": __doc__.split("\n\n")[1]})
        data.setdefault("cells", {}).update(cells)
        runs = ([data.pop("run")] if "run" in data else []) + data.get("runs", []) + fields.pop("runs", [])
        data.update(fields, **({"runs": runs} if runs else {}))
        data["missing"] = missing(data)
        write_json(out, data)
    return data


def missing(data: dict) -> list[str]:
    """Models without a compiled cell that fits, and efficiency figures not yet measured."""
    cells = data.get("cells", {})
    out = [f"step:{m}" for m in MODELS if not any(k.startswith(f"step:{m}:") and c.get("fits") for k, c in cells.items())]
    variants = [f"variant:{v}:qwen2.5-1.5b" for v in ("fp16", "batch_invariant")]
    out += [v for v in variants if not any(k.startswith(v) for k in cells)]
    return out + [key for key in efficiency_keys() if key not in cells]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--only", nargs="*", default=None, help="cell key prefixes, e.g. step:qwen2.5-1.5b efficiency")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes (default: one per CPU core; 1: in this process)")
    parser.add_argument("--table", action="store_true", help="only rewrite docs/benchmarks.md's TPU table from --out")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs {args.jobs}: give 1 or more worker processes")
    if not args.table:
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        run(args.out, args.only, args.jobs)
    from jaxrl_llm.benchmarks.tpu.table import write_table

    print(f"-> {write_table(json.loads(args.out.read_text()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
