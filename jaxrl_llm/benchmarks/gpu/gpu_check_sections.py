"""`make gpu-check`'s plan: the order its sections run in (most valuable first), what each is
expected to cost (so one that would not fit the budget is skipped with the reason, not started),
and the sections that are more than one call: the PyTorch reference in a child process and the
batch-invariance check with its sampler cost.

Estimates: the walls of the last H100 runs (benchmarks/results/gpu-check-nvidia-h100-80gb-hbm3-
2026-11-26*.json, a/b/c), rounded up, or a guess where a section is new or changed (marked);
`section_estimates` raises each to the newest wall recorded for it on the same device, so a
result committed from a later run makes the next plan more exact, never more optimistic.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxrl_llm.benchmarks.common.results import REPO, device_slug
from jaxrl_llm.benchmarks.common.model_shapes import MOE_MODELS, model_config
from jaxrl_llm.benchmarks.common.rl_batch import TINY_MIX, LengthMix, learner_flops, rl_length_mix

DEFAULT_BUDGET_S = 480.0  # 8 minutes, the torch child process included

# Seconds on one H100 (jax 0.11.2). Sampler: 150-185 s per batch size at 1.5B, nearly all compile.
GPU_ESTIMATES_S = {
    "torch": 240.0,  # the child's timeout: eager ~20 s, torch.compile ~2 min (guess), packed eager ~20 s
    "ceilings": 5.0, "attention": 25.0,
    "learner:qwen2.5-1.5b:65536:packed": 25.0, "learner:qwen2.5-1.5b:65536:rows": 25.0,
    "learner:qwen2.5-1.5b:16384:rows": 17.0, "learner:qwen2.5-1.5b:16384:packed": 11.0,
    "learner:qwen2.5-0.5b:65536:packed": 17.0, "learner:qwen2.5-0.5b:65536:rows": 45.0,  # guess
    "learner:qwen2.5-0.5b:16384:packed": 17.0, "learner:qwen2.5-0.5b:16384:rows": 11.0,
    # guess: train.remat=auto may compile the 4-layer, 128-expert step up to three times (off, dots, full)
    "learner:qwen3-30b-a3b-4l:16384:packed": 120.0,
    "learner_phases": 120.0,  # guess: 22 s without levers + ~11 lever compiles
    "batch_invariance": 150.0,  # guess: 4 sampler + 12 learner compiles at 0.5B, + 2 samplers for the cost
    # The sampler sections and the RL step's sampling now take the slot decode on a GPU (one program per
    # batch; its 1.5B compile was 11.5 s vs 433 s for the compacting decode in the CPU proxy,
    # benchmarks/results/sampler-compile-cpu-2026-11-28.json): guesses until a GPU run records them.
    # The 185 s / 200 s walls of 2026-11-26 were the compacting decode (`SLOT_DECODE_SINCE`).
    "rl_run": 60.0, "sampler:64": 45.0, "sampler:256": 45.0, "rl_step": 60.0,
}
SLOT_DECODE_SINCE = "2026-11-28"  # the first date whose gpu-check samples with the slot decode on a GPU
SAMPLING_SECTIONS = ("sampler", "rl_step", "rl_run")
TINY_ESTIMATES_S = {"torch": 240.0, "ceilings": 5.0, "attention": 5.0, "learner_phases": 60.0,
                    "batch_invariance": 60.0, "rl_run": 120.0, "sampler:4": 10.0, "sampler:8": 10.0,
                    "rl_step": 20.0}
TINY_LEARNER_S = 10.0


def run_order(learner_jobs: list[str], sampler_jobs: list[str]) -> list[str]:
    """Every JAX section, most valuable first: the ceilings and the attention check (the learner rows
    depend on it), the headline learner row (the first of `learner_jobs`: 1.5B, ~64k tokens, packed),
    where its time goes and which lever wins (`learner_phases`), batch invariance, the mixture-of-experts
    row (a shape no other section measures), the other 1.5B rows, the sampler and the RL step and run
    (the slow compiles), the 0.5B rows last."""
    moe = [name for name in learner_jobs[1:] if name.split(":")[1] in MOE_MODELS]
    big = [name for name in learner_jobs[1:] if "0.5b" not in name and name not in moe]
    small = [name for name in learner_jobs[1:] if "0.5b" in name]
    return (["ceilings", "attention", *learner_jobs[:1], "learner_phases", "batch_invariance", *moe, *big,
             *sampler_jobs[:1], "rl_step", *sampler_jobs[1:], "rl_run", *small])


def recorded_walls(results_dir: Path, device_kind: str) -> dict[str, float]:
    """Section -> wall of its newest "ok" run in the non-tiny gpu-check files of this device."""
    walls: dict[str, float] = {}
    for path in sorted(Path(results_dir).glob(f"gpu-check-{device_slug(device_kind)}-2*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if data.get("tiny"):
            continue
        for name, section in data.get("sections", {}).items():
            if name.split(":")[0] in SAMPLING_SECTIONS and str(data.get("date", "")) < SLOT_DECODE_SINCE:
                continue  # sampled with the compacting decode, which a GPU no longer takes
            if section.get("status") == "ok" and section.get("wall_s"):
                walls[name] = float(section["wall_s"])  # sorted by date and tag: newer files overwrite
    return walls


def section_estimates(names: list[str], *, tiny: bool, results_dir: Path, device_kind: str) -> dict[str, float]:
    """Estimated seconds of each section: max(the table's, the newest recorded on this device)."""
    table = TINY_ESTIMATES_S if tiny else GPU_ESTIMATES_S
    recorded = {} if tiny else recorded_walls(results_dir, device_kind)
    default = TINY_LEARNER_S if tiny else 45.0
    return {name: max(table.get(name, default), recorded.get(name, 0.0)) for name in names}


# --------------------------------------------------------------- torch reference
def torch_rates(result: dict[str, Any] | None, *, mix: LengthMix, peak: float | None) -> dict[str, Any] | None:
    """The torch reference's runs with tokens/s and MFU by the gpu-check FLOP count (same batch)."""
    if result is None:
        return None
    cfg = model_config(result["model"], mix.prompt_width + mix.completion_width)
    seq, _ = rl_length_mix(result["target_tokens"], mix, cfg.vocab_size)
    flops = learner_flops(cfg, seq)
    for run in result["runs"]:
        run["tokens_per_s"] = flops["tokens"] / run["seconds"]
        run["mfu"] = None if peak is None else flops["flops"] / run["seconds"] / (peak * 1e12)
    return result


def torch_command(tiny: bool, json_path: Path) -> list[str]:
    """The child's command: eager, torch.compile and the packed row, on the gpu-check batch."""
    command = [sys.executable, "-m", "jaxrl_llm.benchmarks.gpu.torch_learner", "--json", str(json_path),
               "--tokens", "256" if tiny else "16384", "--modes", "eager,compile,packed"]
    if tiny:
        command += ["--tiny", "--micro-batch-tokens", str(2 * (TINY_MIX.prompt_width + TINY_MIX.completion_width))]
    return command


def torch_reference(tiny: bool, timeout_s: float) -> dict[str, Any]:
    """`benchmarks.gpu.torch_learner` in a child process: {"status", "wall_s", "result" | "error"}."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "torch.json"
        command = torch_command(tiny, path)
        print(f"[gpu-check] torch reference: {' '.join(command[1:])}", flush=True)
        t0 = time.time()
        try:
            done = subprocess.run(command, cwd=REPO, env={**os.environ, "JAX_PLATFORMS": "cpu"}, text=True,
                                  capture_output=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            finished = json.loads(path.read_text()) if path.exists() else None  # the modes that finished
            return {"status": "failed", "wall_s": time.time() - t0, "error": f"timed out after {timeout_s:.0f} s",
                    **({"result": finished} if finished and finished["runs"] else {})}
        if done.returncode != 0 or not path.exists():
            return {"status": "failed", "wall_s": time.time() - t0,
                    "error": f"exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"}
        return {"status": "ok", "wall_s": time.time() - t0, "result": json.loads(path.read_text())}


# ------------------------------------------------------------ batch invariance
def batch_invariance_check(tiny: bool, rounds: int = 2) -> dict[str, Any]:
    """`benchmarks.common.batch_invariance.exactness` at the 0.5B shape (tiny: the tiny model, 8 sequences;
    random weights), and the sampler's cost of the flag in bf16: tokens/s with it on / off, the two
    samplers taking turns for `rounds` timed rounds after a compile round (`sampler_rates`)."""
    import jax

    from jaxrl_llm.benchmarks.common.batch_invariance import exactness, sampler_rates
    from jaxrl_llm.models import init_params
    import numpy as np

    cfg = model_config("tiny" if tiny else "qwen2.5-0.5b", 128)
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(10, cfg.vocab_size, size=rng.randint(2, 40))) for _ in range(8 if tiny else 64)]
    max_tokens = 8 if tiny else 32
    out = {"exactness": exactness(cfg, params, prompts, max_tokens)}
    typed = cfg.with_dtypes(param_dtype="bfloat16", compute_dtype="bfloat16")
    cast = jax.tree.map(lambda x: x.astype("bfloat16"), params)
    tokens = 8 if tiny else 128
    rates = sampler_rates(typed, cast, prompts, tokens, rounds)
    on, off = statistics.median(rates[True][0]), statistics.median(rates[False][0])
    out["sampler_cost"] = {"dtype": "bfloat16", "sequences": len(prompts), "new_tokens": tokens, "rounds": rounds,
                           "tokens_per_s_on": on, "tokens_per_s_off": off, "on_over_off": on / off}
    out["all_zero_with_flag_on"] = all(not any(v["differing"].values())
                                       for k, v in out["exactness"].items() if k.endswith("batch_invariant=True"))
    return out
