"""`make gpu-sweep`: one call that spends a GPU window measuring variants, not waiting.

    python -m jaxrl_llm.benchmarks.gpu.gpu_sweep [--out-dir DIR] [--budget-s 500] [--sections learner,sampler]
    python -m jaxrl_llm.benchmarks.gpu.gpu_sweep --tiny     # CPU, tiny shapes: the code path only (75 s budget)

Sections, in this order, each with its share of the time budget:

  ceilings  the device's measured bf16 matmul rate (the denominator of `fraction_of_matmul_ceiling`);
  learner   `Learner.update` (the real step, packed, bf16; `gpu_check.learner_row`) at the 1.5B
            shape, ~64k tokens per step, over LM-head chunk x attention path x remat mode
            (`benchmarks.gpu.levers`): the baseline (chunk 128, the backend's default attention path,
            remat "off") first, then every one-change variant, then the rest of the grid;
  sampler   decode tokens/s over batch x cache length x decode path x attention kernel (`sampler_sweep`).

Every variant is recorded: "ok" with its seconds per step, tokens/s, MFU and fraction of the
measured matmul rate; "failed" with its error (the sweep goes on); "skipped" with the reason (an
attention path the backend lacks, or the budget: a variant is started only if the median wall of
those run so far fits what is left). The JSON (benchmarks/results/gpu-sweep-<device>-<date>.json)
is rewritten after every variant, so a run cut off keeps what it measured; `best` names the
fastest learner variant and its speedup over the baseline.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple

import jax

from jaxrl_llm.benchmarks.common.results import RESULTS_DIR, device_slug, git_commit
from jaxrl_llm.benchmarks.gpu.levers import ATTENTION_PATHS, attention_unavailable, lever_environment, switched
from jaxrl_llm.benchmarks.common.rl_batch import TINY_MIX, LengthMix
from jaxrl_llm.models.logprobs import HeadOptions
from jaxrl_llm.models.remat import REMAT_MODES
from jaxrl_llm.utils.atomic_files import write_text_atomic

CHUNKS, TINY_CHUNKS = (128, 1024, 4096), (32, 128)
# Before a variant has run: the H100 walls of 2026-11-26 (a 1.5B ~64k packed learner row 22-24 s with
# its compile; the 1.5B sampler 150-185 s per batch size, nearly all compile).
FIRST_GUESS_S = {"learner": 30.0, "sampler": 150.0}
TINY_FIRST_GUESS_S = {"learner": 10.0, "sampler": 10.0}


class Variant(NamedTuple):
    """One learner configuration of the grid."""

    chunk: int
    attention: str
    remat: str

    @property
    def name(self) -> str:
        return f"chunk{self.chunk}-{self.attention}-{self.remat}"


def learner_variants(chunks: Iterable[int], attentions: Iterable[str], remats: Iterable[str]) -> list[Variant]:
    """The whole grid, ordered: the baseline (the first of each list), the variants one change away
    from it, then the rest (so a budget cut keeps the most informative ones)."""
    chunks, attentions, remats = list(chunks), list(attentions), list(remats)
    base = Variant(chunks[0], attentions[0], remats[0])
    grid = [Variant(c, a, r) for c in chunks for a in attentions for r in remats]
    changes = lambda v: sum(x != y for x, y in zip(v, base))  # noqa: E731
    return sorted(grid, key=changes)  # sorted is stable: grid order within each distance


class Budget:
    """Seconds left of a budget that started at `start`; a job is started only if its estimate fits."""

    def __init__(self, seconds: float, start: float | None = None):
        self.seconds, self.start = seconds, time.time() if start is None else start

    def left(self) -> float:
        return self.seconds - (time.time() - self.start)


def run_recorded(name: str, estimate_s: float, budget: Budget, job: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """job() as a record: status ok (its fields + wall_s), failed (error) or skipped (the budget)."""
    if estimate_s > budget.left():
        return {"status": "skipped", "reason": f"needs ~{estimate_s:.0f} s, {budget.left():.0f} s left of the budget"}
    print(f"[gpu-sweep] {name} ...", flush=True)
    t0 = time.time()
    try:
        record = {"status": "ok", **job()}
    except Exception as error:  # noqa: BLE001 -- a failing variant is a result; the sweep goes on
        record = {"status": "failed", "error": f"{type(error).__name__}: {error}"[:1500]}
        print(f"[gpu-sweep] {name} FAILED: {record['error'][:300]}", flush=True)
    record["wall_s"] = time.time() - t0
    return record


def estimate(records: list[dict[str, Any]], first_guess: float) -> float:
    """The median wall of the records that ran, else the first guess."""
    walls = [r["wall_s"] for r in records if r.get("status") in ("ok", "failed")]
    return statistics.median(walls) if walls else first_guess


def learner_sweep(variants: list[Variant], *, model: str, tokens_per_step: int, micro_batch_tokens: int, steps: int,
                  mix: LengthMix, budget: Budget, first_guess_s: float, peak_tflops: float | None,
                  matmul_tflops: float | None, on_record: Callable[[list[dict]], None] = lambda records: None,
                  head_dim: int = 128) -> list[dict[str, Any]]:
    """One record per variant (module docstring), `on_record(records)` after each."""
    from jaxrl_llm.benchmarks.gpu.gpu_check import learner_row

    records: list[dict[str, Any]] = []
    for variant in variants:
        base = {"name": variant.name, **variant._asdict()}
        missing = attention_unavailable(variant.attention, head_dim)
        if missing:
            records.append({**base, "status": "skipped", "reason": missing})
            continue

        def job(variant=variant):
            with switched(lever_environment(variant.attention, HeadOptions(chunk_size=variant.chunk))):
                row = learner_row(model, tokens_per_step, True, micro_batch_tokens=micro_batch_tokens, steps=steps,
                                  mix=mix, peak_tflops=peak_tflops, remat=variant.remat,
                                  ceiling_flops=None if matmul_tflops is None else matmul_tflops * 1e12)
            return {k: row[k] for k in ("tokens_per_step", "seconds", "seconds_all", "first_step_s", "tokens_per_s",
                                        "model_tflops", "mfu", "fraction_of_matmul_ceiling", "padding_fraction",
                                        "micro_batches_run", "loss")}

        records.append({**base, **run_recorded(variant.name, estimate(records, first_guess_s), budget, job)})
        on_record(records)
    return records


def best_variant(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest "ok" record and the first record's (the baseline's) seconds / its seconds."""
    done = [r for r in records if r.get("status") == "ok"]
    if not done:
        return None
    best = min(done, key=lambda r: r["seconds"])
    baseline = records[0] if records[0].get("status") == "ok" else None
    return {"name": best["name"], "seconds": best["seconds"], "mfu": best.get("mfu"),
            "speedup_vs_baseline": None if baseline is None else baseline["seconds"] / best["seconds"],
            "baseline": records[0]["name"]}


def sampler_sweep(batches: Iterable[int], max_tokens: Iterable[int], *, tiny: bool, budget: Budget,
                  first_guess_s: float, on_record: Callable[[list[dict]], None] = lambda records: None) -> list[dict]:
    """One record per variant of `gpu_sampler.sweep_variants`: batch x cache length (prompt +
    max_tokens) x decode path (the compacting decode with its windowed dense attention; the slot
    decode with each kernel: dense, cuDNN, Pallas) at the 1.5B shape in bf16, prompts of 128 random
    tokens, EOS impossible (``tiny``: the tiny model in float32, prompts of 16, no cuDNN). Each is
    `gpu_sampler.sampler_decode` (one warm-up call that compiles, then one timed call), recorded
    ok / failed / skipped like the learner's variants."""
    from jaxrl_llm.benchmarks.gpu import gpu_sampler

    shape, dtype, prompt_len = ("tiny", "float32", 16) if tiny else ("qwen2.5-1.5b", "bfloat16", 128)
    kernels = tuple(k for k in gpu_sampler.SWEEP_KERNELS if not (tiny and k == "cudnn"))
    caches = [prompt_len + t for t in max_tokens]
    records: list[dict[str, Any]] = []
    for variant in gpu_sampler.sweep_variants(batches, caches, ("compact", "slots"), kernels):
        slots = variant["decode"] == "slots"
        options = {"decode": variant["decode"], **({"decode_kernel": variant["kernel"]} if slots else {})}
        name = f"batch{variant['batch']}-cache{variant['cache_length']}-{variant['decode']}" + (
            f"-{variant['kernel']}" if slots else "")

        def job(variant=variant, options=options) -> dict[str, Any]:
            return gpu_sampler.sampler_decode(shape, variant["batch"], variant["cache_length"] - prompt_len,
                                              dtype=dtype, prompt_len=prompt_len, tiny=tiny, repeats=1,
                                              sampler_options=options)

        record = run_recorded(name, estimate(records, first_guess_s), budget, job)
        records.append({"name": name, **variant, "max_tokens": variant["cache_length"] - prompt_len, **record})
        on_record(records)
    return records


class SweepFile:
    """The result file, rewritten (atomically) whenever a record lands."""

    def __init__(self, out_dir: Path, tiny: bool, budget_s: float, tag: str = ""):
        device = jax.devices()[0]
        kind = device.device_kind if device.platform != "cpu" else f"cpu-{platform.machine()}"
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        self.path = Path(out_dir) / f"gpu-sweep-{device_slug(kind)}{'-tiny' if tiny else ''}-{date}{tag}.json"
        self.start = time.time()
        self.data: dict[str, Any] = {"device": kind, "platform": device.platform, "date": date,
                                     "commit": git_commit(), "jax": jax.__version__, "tiny": tiny,
                                     "budget_s": budget_s, "ceilings": {}, "learner": [], "sampler": [],
                                     "best": None}

    def put(self, key: str, value: Any) -> None:
        self.data[key] = value
        if key == "learner":
            self.data["best"] = best_variant(value)
        self.data["wall_s"] = time.time() - self.start
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.path, json.dumps(self.data, indent=2, default=float))


def positive_ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise SystemExit(f"{flag}={text!r} must be a comma-separated list of positive integers")
    return values


def names(text: str, flag: str, valid: Iterable[str]) -> list[str]:
    values, valid = text.split(","), list(valid)
    bad = [v for v in values if v not in valid]
    if bad:
        raise SystemExit(f"{flag}: {bad} unknown; valid: {', '.join(valid)}")
    return values


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    parser.add_argument("--budget-s", type=float, default=None,
                        help="all sections together (default 500: a 15-min window less the machine's start; tiny 75)")
    parser.add_argument("--learner-share", type=float, default=0.6, help="of the budget, for the learner section")
    parser.add_argument("--sections", default="ceilings,learner,sampler")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized shapes: the code path only")
    parser.add_argument("--model", default="qwen2.5-1.5b")
    parser.add_argument("--tokens", type=int, default=65536, help="learner tokens per step")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=2, help="timed learner steps per variant (after the compile)")
    parser.add_argument("--chunks", default=None, help=f"LM-head chunks (default {CHUNKS}; tiny {TINY_CHUNKS})")
    parser.add_argument("--attention", default=",".join(ATTENTION_PATHS))
    parser.add_argument("--remat", default=",".join(REMAT_MODES))
    parser.add_argument("--batches", default=None, help="sampler batch sizes (default 64,256; tiny 4,8)")
    parser.add_argument("--max-tokens", default=None, help="sampler new tokens (default 512,2048; tiny 8)")
    parser.add_argument("--tag", default="")
    parser.add_argument("--tokenizer-dir", default=None, help="accepted for launch/gpu_check.sh; unused")
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.budget_s = args.budget_s if args.budget_s is not None else 75.0 if tiny else 500.0
    sections = names(args.sections, "--sections", ("ceilings", "learner", "sampler"))
    chunks = positive_ints(args.chunks or ",".join(map(str, TINY_CHUNKS if tiny else CHUNKS)), "--chunks")
    attentions = names(args.attention, "--attention", ATTENTION_PATHS)
    remats = names(args.remat, "--remat", REMAT_MODES)
    batches = positive_ints(args.batches or ("4,8" if tiny else "64,256"), "--batches")
    max_tokens = positive_ints(args.max_tokens or ("8" if tiny else "512,2048"), "--max-tokens")
    if args.budget_s <= 0 or not 0 < args.learner_share <= 1 or args.steps < 1:
        raise SystemExit(f"--budget-s ({args.budget_s}) must be > 0, --learner-share ({args.learner_share}) in "
                         f"(0, 1], --steps ({args.steps}) >= 1")
    return run_sweep(args, tiny, sections, chunks, attentions, remats, batches, max_tokens)


def run_sweep(args, tiny, sections, chunks, attentions, remats, batches, max_tokens) -> int:
    from jaxrl_llm.benchmarks.common.model_shapes import model_config
    from jaxrl_llm.benchmarks.gpu.learner_gpu import datasheet_peak, matmul_ceiling
    from jaxrl_llm.benchmarks.gpu.levers import default_attention_path

    out = SweepFile(Path(args.out_dir), tiny, args.budget_s, args.tag)
    total = Budget(args.budget_s, out.start)
    guesses = TINY_FIRST_GUESS_S if tiny else FIRST_GUESS_S
    print(f"[gpu-sweep] devices: {jax.devices()} -> {out.path}", flush=True)
    peak = datasheet_peak(out.data["device"], "bf16")
    if "ceilings" in sections:
        rate = matmul_ceiling("bfloat16", 256 if tiny else 8192, 5) / 1e12
        out.put("ceilings", {"peak_tflops": peak, "matmul_tflops": rate})
    matmul_tflops = out.data["ceilings"].get("matmul_tflops")
    if "learner" in sections:
        model = "tiny" if tiny else args.model
        mix = TINY_MIX if tiny else LengthMix()
        head_dim = model_config(model, 64).head_dim
        attentions = sorted(attentions, key=lambda a: a != default_attention_path(head_dim))  # the baseline's first
        learner_budget = Budget(min(total.left(), args.budget_s * args.learner_share) if "sampler" in sections
                                else total.left())
        learner_sweep(learner_variants(chunks, attentions, remats), model=model,
                      tokens_per_step=256 if tiny else args.tokens, steps=1 if tiny else args.steps,
                      micro_batch_tokens=2 * (mix.prompt_width + mix.completion_width) if tiny else args.micro_batch_tokens,
                      mix=mix, budget=learner_budget, first_guess_s=guesses["learner"], peak_tflops=peak,
                      matmul_tflops=matmul_tflops, on_record=lambda records: out.put("learner", records),
                      head_dim=head_dim)
    if "sampler" in sections:
        sampler_sweep(batches, max_tokens, tiny=tiny, budget=total, first_guess_s=guesses["sampler"],
                      on_record=lambda records: out.put("sampler", records))
    out.put("wall_s", time.time() - out.start)
    print(f"[gpu-sweep] wrote {out.path}; best learner variant: {out.data['best']}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
