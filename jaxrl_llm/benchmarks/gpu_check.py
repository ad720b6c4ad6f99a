"""`make gpu-check`: one prepared command that measures the learner, the JAX sampler and an RL run
on whatever accelerator JAX finds, and writes benchmarks/results/gpu-check-<device>-<date>.json (+ .md).

    python -m jaxrl_llm.benchmarks.gpu_check [--out-dir DIR] [--budget-s 450] [--tokenizer-dir DIR]
    python -m jaxrl_llm.benchmarks.gpu_check --tiny     # CPU, tiny shapes: the code path only

Sections, run in this order while the time budget lasts (a section that would not fit is
recorded as skipped; one that fails is recorded with its error and the rest still run; the
result file is rewritten after every section, so a run cut short keeps what it measured;
`benchmarks.gpu_check_report`):

  torch         the PyTorch reference of a learner row (`benchmarks.torch_learner`: the same batch,
                eager and torch.compile), in a child process before JAX takes the device;
  ceilings      the device's measured bf16 matmul rate and copy bandwidth;
  attention     cuDNN's segment-aware attention on packed rows against its mask path and a
                float32 XLA reference (forward and gradients), GPU only;
  batch_invariance  bitwise on-policy sampling on the device (`benchmarks.batch_invariance.exactness`):
                64 sequences sampled at the Qwen2.5-0.5B shape (random weights; --tiny: the tiny model),
                bf16 and fp32, rollout.batch_invariant on and off; per composition of the learner's
                batch, how many sampled log-probs differ from its pi_old (on: must be 0);
  learner       `Learner.update` (the real step: micro-batches, fp32 master weights, AdamW,
                train.remat=auto) at the Qwen2.5-1.5B and 0.5B shapes (random weights), bf16,
                an RL length mix (`rl_length_mix`), 64k and 16k tokens per step, packed and
                one sequence per row; tokens/s and MFU;
  learner_phases  one packed micro-batch's layers, LM head and optimiser timed alone
                (`benchmarks.learner_phases`): where the learner's time goes;
  sampler       JAX sampler decode tokens/s and the memory-bandwidth roofline fraction, one
                section per batch size (`gpu_sampler.sampler_decode`);
  rl_run        an end-to-end RL run on the device (`gpu_rl.rl_end_to_end`);
  rl_step       one full RL step at the 1.5B shape (`gpu_rl.rl_step_at_scale`).

Learner FLOPs per step (the standard count, Kaplan et al. 2020 and PaLM appendix B, with the
LM head charged only on completion tokens, which is all the learner computes it on):
6 * N_body * tokens + 6 * D * V * completion_tokens + 12 * L * H * hd * sum_i L_i (L_i + 1) / 2,
N_body = the matmul weights of the layers, L_i the length of sequence i. MFU = FLOPs / time /
datasheet dense bf16 peak (`learner_gpu.PEAK_TFLOPS`); also given against the measured matmul rate.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.benchmarks.gpu_check_report import Report, _pct
from jaxrl_llm.benchmarks.learner_gpu import datasheet_peak, matmul_ceiling, model_config
from jaxrl_llm.benchmarks.learner_phases import learner_phases
from jaxrl_llm.benchmarks.rl_batch import TINY_MIX, LengthMix, learner_flops, rl_length_mix
from jaxrl_llm.benchmarks.timing import interleaved_times, median_seconds
from jaxrl_llm.models import init_params
from jaxrl_llm.models.fused_attention import SEGMENTS_SWITCH
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner

REPO = Path(__file__).resolve().parents[2]
SEGMENT_TOLERANCE = 2e-2  # relative error vs float32 that bf16 attention stays well under (METHOD: 1e-3..1e-2)


# ---------------------------------------------------------------- learner rows
def learner_row(model: str, tokens_per_step: int, pack: bool, *, micro_batch_tokens: int, steps: int,
                mix: LengthMix, peak_tflops: float | None, ceiling_flops: float | None) -> dict[str, Any]:
    """`Learner.update` on one RL-like step: median seconds over `steps` after a warm-up (compile)."""
    cfg = model_config(model, mix.prompt_width + mix.completion_width)
    seq, rewards = rl_length_mix(tokens_per_step, mix, cfg.vocab_size)
    train_cfg = dataclasses.replace(TrainConfig(), precision="bf16", lr=1e-6, pack=pack, remat="auto",
                                    micro_batch_tokens=micro_batch_tokens)
    recipe = core.get_recipe("grpo")
    batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards), jnp.asarray(seq.completion_mask),
                                                               jnp.asarray(seq.sampler_logp)))
    learner = Learner(cfg, recipe, train_cfg, total_steps=steps + 2)
    params = init_params(cfg, jax.random.key(0), dtype="float32")
    holder = {"state": learner.init(params)}
    del params

    def step():
        holder["state"], metrics = learner.update(holder["state"], seq, batch)
        holder["metrics"] = jax.device_get(metrics)

    t0 = time.perf_counter()
    step()
    compile_s = time.perf_counter() - t0
    times = interleaved_times({"step": step}, 0, steps)["step"]
    seconds, metrics = float(np.median(times)), holder["metrics"]
    flops = learner_flops(cfg, seq)
    achieved = flops["flops"] / seconds
    plan = learner.plan(seq)
    row = {"model": model, "tokens_per_step": int(flops["tokens"]), "target_tokens": tokens_per_step,
           "sequences": int(seq.tokens.shape[0]), "pack": pack, "micro_batch_tokens": micro_batch_tokens,
           "micro_batches_run": int(plan.used.sum()), "rows_per_micro_batch": int(plan.tokens.shape[1]),
           "row_width": int(plan.tokens.shape[2]), "padding_fraction": float(metrics["learner_padding_fraction"]),
           "remat": learner.remat, "remat_estimates_bytes": dict(learner.remat_choice.estimates)
           if learner.remat_choice else {}, "seconds": seconds, "seconds_all": times, "first_step_s": compile_s,
           "tokens_per_s": flops["tokens"] / seconds, "completion_tokens_per_s": flops["completion_tokens"] / seconds,
           "model_tflops": achieved / 1e12, "flops_per_step": flops["flops"],
           "mfu": None if peak_tflops is None else achieved / (peak_tflops * 1e12),
           "fraction_of_matmul_ceiling": None if ceiling_flops is None else achieved / ceiling_flops,
           "loss": float(metrics["loss"]), "skipped": float(metrics["skipped"])}
    return row


# ----------------------------------------------------------- attention check
def attention_check(seed: int = 0) -> dict[str, Any]:
    """cuDNN segment-aware attention vs the cuDNN mask path vs float32 XLA, on packed bf16 rows:
    relative errors of the output at real slots and of dq, dk, dv."""
    from jaxrl_llm.models.attention import causal_attention, grouped_attention
    from jaxrl_llm.models.fused_attention import segment_spans, use_cudnn_attention

    if not use_cudnn_attention(jnp.bfloat16, 128):
        return {"skipped": f"no cuDNN attention on backend {jax.default_backend()!r}"}
    batch, length, heads, kv_heads, hd = 2, 1024, 12, 2, 128
    segments = np.zeros((batch, length), np.int32)
    segments[0, :300], segments[0, 300:700], segments[0, 700:1000] = 1, 2, 3
    segments[1, :1024] = 1
    segments = jnp.asarray(segments)
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (batch, length, heads, hd), jnp.float32)
    k = jax.random.normal(keys[1], (batch, length, kv_heads, hd), jnp.float32)
    v = jax.random.normal(keys[2], (batch, length, kv_heads, hd), jnp.float32)
    cotangent = jax.random.normal(keys[3], q.shape, jnp.float32)
    real = (segments > 0)[:, :, None, None]
    causal = jnp.tril(jnp.ones((length, length), bool))
    visible = causal[None] & (segments[:, :, None] == segments[:, None, :]) & (segments[:, None, :] > 0)

    def loss(attend, q, k, v):
        return jnp.sum(jnp.where(real, attend(q, k, v).astype(jnp.float32), 0.0) * cotangent)

    def run(attend, dtype):
        args = [x.astype(dtype) for x in (q, k, v)]
        out = jax.jit(attend)(*args).astype(jnp.float32)
        grads = jax.jit(jax.grad(lambda *a: loss(attend, *a), argnums=(0, 1, 2)))(*args)
        return [jnp.where(real, out, 0.0)] + [g.astype(jnp.float32) for g in grads]

    spans = segment_spans(segments, visible, 4)
    reference = run(lambda q, k, v: grouped_attention(q, k, v, visible), jnp.float32)
    variants = {"cudnn_segments": lambda q, k, v: causal_attention(q, k, v, spans),
                "cudnn_mask": lambda q, k, v: causal_attention(q, k, v, visible)}
    out: dict[str, Any] = {"shape": [batch, length, heads, kv_heads, hd], "segments": [[300, 400, 300], [1024]]}
    for name, attend in variants.items():
        got = run(attend, jnp.bfloat16)
        out[name] = {part: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))
                     for part, a, b in zip(("out", "dq", "dk", "dv"), got, reference)}
        fn = jax.jit(jax.grad(lambda *a, attend=attend: loss(attend, *a), argnums=(0, 1, 2)))
        args = [x.astype(jnp.bfloat16) for x in (q, k, v)]
        out[name]["fwd_bwd_ms"] = 1e3 * median_seconds(lambda: jax.block_until_ready(fn(*args)), 20)
    return out


def batch_invariance_check(tiny: bool) -> dict[str, Any]:
    """`benchmarks.batch_invariance.exactness` at the 0.5B shape (tiny: the tiny model, 8 sequences)."""
    from jaxrl_llm.benchmarks.batch_invariance import exactness

    cfg = model_config("tiny" if tiny else "qwen2.5-0.5b", 128)
    params = init_params(cfg, jax.random.PRNGKey(0))
    rng = np.random.RandomState(0)
    prompts = [list(rng.randint(10, cfg.vocab_size, size=rng.randint(2, 40))) for _ in range(8 if tiny else 64)]
    return exactness(cfg, params, prompts, 8 if tiny else 32)


def learner_plan(tiny: bool) -> list[tuple[str, int, bool, float]]:
    """(model, tokens per step, pack, estimated seconds) in the order they run."""
    if tiny:
        return [("tiny", 256, True, 5), ("tiny", 256, False, 5)]
    return [("qwen2.5-1.5b", 65536, True, 30), ("qwen2.5-1.5b", 65536, False, 30),
            ("qwen2.5-1.5b", 16384, False, 15), ("qwen2.5-1.5b", 16384, True, 15),
            ("qwen2.5-0.5b", 65536, True, 35), ("qwen2.5-0.5b", 65536, False, 45),
            ("qwen2.5-0.5b", 16384, True, 25), ("qwen2.5-0.5b", 16384, False, 25)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    parser.add_argument("--budget-s", type=float, default=450.0, help="stop starting sections after this")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized shapes: the code path only")
    parser.add_argument("--tokenizer-dir", default=None, help="tokenizer files for the RL run (default: SmolLM2's)")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=2, help="timed learner steps per row (after a warm-up)")
    parser.add_argument("--only", default=None, help="comma-separated sections (or learner rows, e.g. "
                        "learner:qwen2.5-0.5b:16384:packed) to run (default: all)")
    parser.add_argument("--tag", default="", help="appended to the result file's name (a second run the same day)")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.budget_s <= 0:
        parser.error(f"--steps ({args.steps}) must be >= 1 and --budget-s ({args.budget_s}) > 0")
    only = None if args.only is None else set(args.only.split(","))
    started = time.time()
    torch_result = None
    if only is None or "torch" in only:  # before JAX takes the device's memory
        torch_result = torch_reference(args.tiny, timeout_s=min(240.0, args.budget_s / 2))
    report = Report(Path(args.out_dir), args.tiny, args.budget_s, args.tag)
    report.start = started
    if torch_result is not None:
        report.data["torch"] = torch_rates(torch_result.get("result"), mix=TINY_MIX if args.tiny else LengthMix(),
                                           peak=datasheet_peak(report.data["device"], "bf16"))
        report.data["sections"]["torch"] = {k: v for k, v in torch_result.items() if k != "result"}
        report.write()
    print(f"[gpu-check] devices: {jax.devices()} -> {report.path}", flush=True)
    wanted = lambda name: only is None or name in only or name.split(":")[0] in only  # noqa: E731
    mix = TINY_MIX if args.tiny else LengthMix()
    micro_tokens = 2 * (mix.prompt_width + mix.completion_width) if args.tiny else args.micro_batch_tokens
    peak = datasheet_peak(report.data["device"], "bf16")
    ceilings: dict[str, Any] = {"peak_tflops": peak}

    def measure_ceilings():
        ceilings["matmul_tflops"] = matmul_ceiling("bfloat16", 256 if args.tiny else 8192, 5) / 1e12
        from jaxrl_llm.benchmarks.gpu_sampler import copy_bandwidth

        ceilings["copy_gb_s"] = copy_bandwidth(2 ** 22 if args.tiny else 2 ** 30)["copy_bandwidth_Bps"] / 1e9
        report.data["ceilings"] = ceilings
        return ceilings

    if wanted("ceilings"):
        report.section("ceilings", 10, measure_ceilings)
    if wanted("attention"):
        attention = report.data["attention"] = report.section("attention", 20, attention_check)
        errors = (attention or {}).get("cudnn_segments", {})
        if attention is None or ("skipped" not in attention and not all(
                errors.get(part, 1.0) < SEGMENT_TOLERANCE for part in ("out", "dq", "dk", "dv"))):
            # the segment-aware call failed or disagrees: the learner rows use the mask path
            os.environ[SEGMENTS_SWITCH] = "0"
            report.data["cudnn_segments_disabled"] = True
            report.write()
    if wanted("batch_invariance"):
        report.data["batch_invariance"] = report.section("batch_invariance", 20 if args.tiny else 90,
                                                         lambda: batch_invariance_check(args.tiny))
        report.write()

    def gpu_rl():  # imported by the sections that use it: an import error fails those sections only
        from jaxrl_llm.benchmarks import gpu_rl as module
        return module

    def gpu_sampler():
        from jaxrl_llm.benchmarks import gpu_sampler as module
        return module

    tokenizer_dir = args.tokenizer_dir
    runs: list[tuple[str, float, Callable[[], Any]]] = []
    learner_jobs = [(f"learner:{model}:{tokens}:{'packed' if pack else 'rows'}", estimate,
                     _learner_job(report, model, tokens, pack, micro_tokens, args.steps, mix, peak, ceilings))
                    for model, tokens, pack, estimate in learner_plan(args.tiny)]
    work = Path(tempfile.mkdtemp(prefix="gpu_check_rl_"))  # the RL run's model and run folders, not results
    runs += learner_jobs[:1]
    runs.append(("learner_phases", 10 if args.tiny else 45,
                 lambda: learner_phases(micro_batch_tokens=micro_tokens, tiny=args.tiny)))
    runs += learner_jobs[1:3]
    # Estimates from the H100 run of 2026-11-26: the RL run 124 s; the 1.5B sampler compiles for
    # 150-185 s per batch size (its decode loops: one per compaction size, each reading the cache in
    # windows), and the 1.5B RL step compiles that sampler too, so the whole list needs ~15 min and an
    # 8-minute budget skips its tail.
    runs.append(("rl_run", 120 if args.tiny else 130, lambda: gpu_rl().rl_end_to_end(
        work, tiny=args.tiny, tokenizer_dir=tokenizer_dir)))
    for batch in (4, 8) if args.tiny else (256, 64):
        runs.append((f"sampler:{batch}", 10 if args.tiny else 200, lambda batch=batch: gpu_sampler().sampler_decode(
            "tiny" if args.tiny else "qwen2.5-1.5b", batch, 8 if args.tiny else 512, tiny=args.tiny, repeats=1)))
    runs.append(("rl_step", 20 if args.tiny else 260, lambda: gpu_rl().rl_step_at_scale(tiny=args.tiny, remat="auto")))
    runs += learner_jobs[3:]
    for name, estimate, job in runs:
        group = name.split(":")[0]
        if not wanted(name):
            continue
        result = report.section(name, estimate, job)
        if group == "sampler":
            report.data.setdefault("sampler", []).extend([] if result is None else [result])
        elif group in ("rl_run", "rl_step", "learner_phases"):
            report.data[group] = result
        report.write()
    print(report.path.with_suffix(".md").read_text(), flush=True)
    return 0


def torch_rates(result: dict[str, Any] | None, *, mix: LengthMix, peak: float | None) -> dict[str, Any] | None:
    """The torch reference's runs with tokens/s and MFU by this module's FLOP count (same batch)."""
    if result is None:
        return None
    cfg = model_config(result["model"], mix.prompt_width + mix.completion_width)
    seq, _ = rl_length_mix(result["target_tokens"], mix, cfg.vocab_size)
    flops = learner_flops(cfg, seq)
    for run in result["runs"]:
        run["tokens_per_s"] = flops["tokens"] / run["seconds"]
        run["mfu"] = None if peak is None else flops["flops"] / run["seconds"] / (peak * 1e12)
    return result


def torch_reference(tiny: bool, timeout_s: float) -> dict[str, Any]:
    """`benchmarks.torch_learner` in a child process: {"status", "wall_s", "result" | "error"}."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "torch.json"
        command = [sys.executable, "-m",
                   "jaxrl_llm.benchmarks.torch_learner", "--json", str(path), "--tokens", "256" if tiny else "16384"]
        if tiny:
            command += ["--tiny", "--micro-batch-tokens", str(2 * (TINY_MIX.prompt_width + TINY_MIX.completion_width))]
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


def _learner_job(report: Report, model, tokens, pack, micro_tokens, steps, mix, peak, ceilings):
    def job():
        ceiling = ceilings.get("matmul_tflops")
        row = learner_row(model, tokens, pack, micro_batch_tokens=micro_tokens, steps=steps, mix=mix,
                          peak_tflops=peak, ceiling_flops=None if ceiling is None else ceiling * 1e12)
        report.data["learner"].append(row)
        print(f"[gpu-check]   {model} {row['tokens_per_step']} tok {'packed' if pack else 'rows'}: "
              f"{row['seconds']:.3f} s/step, {row['tokens_per_s']:.0f} tok/s, MFU {_pct(row['mfu'])}, "
              f"padding {_pct(row['padding_fraction'])}, remat {row['remat']}", flush=True)
        return row
    return job


if __name__ == "__main__":
    raise SystemExit(main())
