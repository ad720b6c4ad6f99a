"""Compile the programs of an RL step for a TPU slice and say, per program and per chip, what they
need and where their time would go.

Per program: HBM in use (XLA's ``memory_analysis``: arguments + outputs + temporaries + generated
code - aliased bytes), whether it fits the chip's HBM, matrix FLOPs and HBM bytes counted through
loops (`hlo_cost`), the collectives in the compiled HLO (kind, count, bytes), and a roofline
ESTIMATE of its time: max(FLOPs / peak bf16 FLOP/s, HBM bytes / HBM bandwidth) + collective bytes
sent / ICI bandwidth (datasheet figures, `chips.CHIPS`). The estimate assumes perfect overlap of
compute and memory and none of collectives with either; it is not a measurement.

A program that does not fit is refused (`DoesNotFit`: one line naming the program, the chip's HBM
and the bytes needed), also when XLA's compile itself runs out of memory.
"""
from __future__ import annotations

import re
import time
from typing import Any, NamedTuple

from jaxrl_llm.benchmarks.tpu.chips import GIB, Slice
from jaxrl_llm.benchmarks.tpu.hlo_cost import program_cost
from jaxrl_llm.benchmarks.tpu.programs import Program

# XLA's words when a program's buffers exceed the device memory at compile time: libtpu 0.0.42 says
# "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries
# (25.53G) exceeds available HBM (15.75G)."; older ones "Ran out of memory in memory space hbm.
# Used 20.5G of 15.75G hbm."
_OOM = re.compile(r"(Ran out of memory|RESOURCE_EXHAUSTED|out of memory)", re.IGNORECASE)
_USED = re.compile(r"(?:Used|required for [\w ]+\() ?([\d.]+)([KMGT])")
_UNIT = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


class DoesNotFit(Exception):
    """A program needs more HBM than a chip has (one line: program, chip HBM, bytes needed)."""


class NotCompilable(Exception):
    """XLA's compiler for the slice has no implementation of something the program needs (one line:
    the program and XLA's reason), e.g. fp16's f16 x f16 -> f32 dots on TPU."""


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


def refusal(program: str, slice_: Slice, needed: float | None) -> str:
    need = "more than the chip has (XLA ran out of memory)" if needed is None else \
        f"{_gib(needed)} ({int(needed)} bytes) per chip"
    return f"{program} does not fit {slice_.name}: it needs {need}, a {slice_.chip.generation} chip has " \
        f"{_gib(slice_.chip.hbm_bytes)} of HBM"


def oom_bytes(message: str) -> float | None:
    """The bytes XLA says a program needed, from its out-of-memory message (None if not stated)."""
    used = _USED.search(message)
    return float(used.group(1)) * _UNIT[used.group(2)] if used else None


def compile_uncached(lowered):
    """``lowered.compile()`` without writing to JAX's persistent compilation cache: an executable for
    deviceless TPU devices cannot be loaded back on this machine (a later lookup would fail and warn),
    so none is stored (a minimum compile time no compile reaches; JAX reads it at each write)."""
    import jax

    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1e12)
    try:
        return lowered.compile()
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", before)


class ProgramReport(NamedTuple):
    name: str
    row: dict  # JSON-ready


def _memory(compiled) -> dict:
    stats = compiled.memory_analysis()
    parts = {"argument_bytes": stats.argument_size_in_bytes, "output_bytes": stats.output_size_in_bytes,
             "temp_bytes": stats.temp_size_in_bytes, "generated_code_bytes": stats.generated_code_size_in_bytes,
             "alias_bytes": stats.alias_size_in_bytes}
    parts = {k: int(v) for k, v in parts.items()}
    parts["hbm_bytes"] = (parts["argument_bytes"] + parts["output_bytes"] + parts["temp_bytes"]
                          + parts["generated_code_bytes"] - parts["alias_bytes"])
    return parts


def roofline(flops: float, hbm_bytes: float, ici_bytes: float, slice_: Slice) -> dict:
    """Seconds per chip, an ESTIMATE from datasheet figures (module doc)."""
    chip = slice_.chip
    compute, memory, comms = flops / chip.peak_bf16_flops, hbm_bytes / chip.hbm_bytes_per_s, ici_bytes / chip.ici_bytes_per_s
    return {"estimate": True, "compute_s": compute, "hbm_s": memory, "ici_s": comms,
            "seconds": max(compute, memory) + comms, "bound": "compute" if compute >= memory else "memory",
            "source": chip.source}


def analyse(program: Program, slice_: Slice, *, refuse: bool = True) -> ProgramReport:
    """Compile ``program`` and report it (module doc). ``refuse``: raise `DoesNotFit` when it does not
    fit; else the row says ``fits: false``."""
    t0 = time.perf_counter()
    try:
        compiled = compile_uncached(program.lowered)
    except Exception as err:  # XLA's compile-time OOM: the same refusal, with the bytes it names
        text = str(err)
        if "UNIMPLEMENTED" in text:
            reason = " ".join(text.split())[:300]
            raise NotCompilable(f"{program.name} cannot be compiled for {slice_.name}: {reason}") from None
        if not _OOM.search(text):
            raise
        needed = oom_bytes(text)
        if refuse:
            raise DoesNotFit(refusal(program.name, slice_, needed)) from None
        return ProgramReport(program.name, {"program": program.name, "fits": False, "compile_error": "out of memory",
                                            "hbm_bytes": needed, **program.notes})
    compile_s = time.perf_counter() - t0
    memory = _memory(compiled)
    fits = memory["hbm_bytes"] <= slice_.chip.hbm_bytes
    if refuse and not fits:
        raise DoesNotFit(refusal(program.name, slice_, memory["hbm_bytes"]))
    cost = program_cost(compiled.as_text())
    xla = compiled.cost_analysis() or {}
    if isinstance(xla, list):
        xla = xla[0] if xla else {}
    ici = sum(row["ici_bytes"] for row in cost.collectives.values())
    row = {"program": program.name, "fits": fits, "compile_s": round(compile_s, 2), **memory,
           "hbm_fraction": memory["hbm_bytes"] / slice_.chip.hbm_bytes, "flops": cost.flops,
           "hbm_bytes_accessed": cost.hbm_bytes, "xla_flops_loop_bodies_once": float(xla.get("flops", 0.0)),
           "xla_bytes_accessed_loop_bodies_once": float(xla.get("bytes accessed", 0.0)),
           "collectives": cost.collectives, "loops": cost.loops, "unknown_loops": cost.unknown_loops,
           "roofline": roofline(cost.flops, cost.hbm_bytes, ici, slice_), **program.notes}
    return ProgramReport(program.name, row)


def choose_remat_for(lower_update, slice_: Slice, modes=("off", "dots", "full"), fraction: float = 0.9) -> tuple[str, dict]:
    """train.remat="auto" for a slice: the first of ``modes`` whose compiled learner update fits
    ``fraction`` of the chip's HBM (`models.remat.choose_remat`, the run's own rule, with the target
    chip's budget). ``lower_update(mode)`` returns the lowered update. Returns (mode, estimates)."""
    from jaxrl_llm.models.remat import choose_remat

    def compile_mode(mode: str) -> Any:
        try:
            return compile_uncached(lower_update(mode))
        except Exception as err:
            if not _OOM.search(str(err)):
                raise
            return _Oversized(oom_bytes(str(err)) or float(slice_.chip.hbm_bytes) * 2)

    choice = choose_remat(compile_mode, int(slice_.chip.hbm_bytes * fraction), modes=modes)
    return choice.mode, choice.estimates


class _Stats(NamedTuple):
    argument_size_in_bytes: int
    output_size_in_bytes: int
    temp_size_in_bytes: int
    generated_code_size_in_bytes: int
    alias_size_in_bytes: int


class _Oversized:
    """Stands in for a program XLA refused to compile for lack of memory: its memory analysis says
    the bytes XLA's message named, so `choose_remat` moves on to the next mode."""

    def __init__(self, needed: float):
        self._needed = int(needed)

    def memory_analysis(self) -> _Stats:
        return _Stats(0, 0, self._needed, 0, 0)
