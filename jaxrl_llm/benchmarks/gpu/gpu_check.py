"""`make gpu-check`: one prepared command that measures the learner, the JAX sampler and an RL run
on whatever accelerator JAX finds, and writes benchmarks/results/gpu-check-<device>-<date>.json (+ .md).

    python -m jaxrl_llm.benchmarks.gpu.gpu_check [--out-dir DIR] [--budget-s 480] [--tokenizer-dir DIR]
    python -m jaxrl_llm.benchmarks.gpu.gpu_check --tiny     # CPU, tiny shapes: the code path only

The budget (default 480 s, everything included) is spent most valuable section first
(`gpu_check_sections.run_order`): a section whose estimated cost (`section_estimates`: the last
H100 walls, or a guess) does not fit what is left is recorded as skipped with that reason; one
that fails is recorded with its error and the rest still run; the result file is rewritten after
every section, so a run cut short keeps what it measured (`benchmarks.gpu.gpu_check_report`).
Sections (described in the order of the pipeline, not of the run):

  torch         the PyTorch reference of a learner row (`benchmarks.gpu.torch_learner`: the same batch,
                eager, torch.compile and packed), in a child process before JAX takes the device;
  ceilings      the device's measured bf16 matmul rate and copy bandwidth;
  attention     cuDNN's segment-aware attention on packed rows against its mask path and a
                float32 XLA reference (forward and gradients), GPU only;
  batch_invariance  bitwise on-policy sampling on the device (`benchmarks.common.batch_invariance.exactness`):
                64 sequences sampled at the Qwen2.5-0.5B shape (random weights; --tiny: the tiny model),
                bf16 and fp32, rollout.batch_invariant on and off; per composition of the learner's
                batch, how many sampled log-probs differ from its pi_old (on: must be 0); and the
                sampler's tokens/s with the flag on / off in bf16 (`gpu_check_sections`);
  learner       `Learner.update` (the real step: micro-batches, fp32 master weights, AdamW,
                train.remat=auto) at the Qwen2.5-1.5B and 0.5B shapes (random weights), bf16,
                an RL length mix (`rl_length_mix`), 64k and 16k tokens per step, packed and
                one sequence per row; tokens/s and MFU; and a mixture of experts: Qwen3-30B-A3B's
                layer with 4 of its 48 layers (`common.model_shapes.MOE_MODELS`), 16k tokens, packed
                (--tiny: `tiny-moe`), MFU on its active parameters (below);
  learner_phases  one packed micro-batch's layers, LM head and optimiser timed alone
                (`benchmarks.gpu.learner_phases`): where the learner's time goes; then each lever of
                the head and the layers alone, and which one won by how much;
  sampler       JAX sampler decode tokens/s and the memory-bandwidth roofline fraction, one
                section per batch size (`gpu_sampler.sampler_decode`);
  rl_run        an end-to-end RL run on the device (`gpu_rl.rl_end_to_end`);
  rl_step       one full RL step at the 1.5B shape (`gpu_rl.rl_step_at_scale`).

Learner FLOPs per step (the standard count, Kaplan et al. 2020 and PaLM appendix B, with the
LM head charged only on completion tokens, which is all the learner computes it on):
6 * N_body * tokens + 6 * D * V * completion_tokens + 12 * L * H * hd * sum_i L_i (L_i + 1) / 2,
N_body = the matmul weights of the layers, L_i the length of sequence i. MFU = FLOPs / time /
datasheet dense bf16 peak (`learner_gpu.PEAK_TFLOPS`); also given against the measured matmul rate.
A mixture of experts counts its ACTIVE parameters in N_body (router + the k experts a token routes
to: `rl_batch.body_params`), so "mfu" is MFU on active parameters. Its row names the experts' form
(`DecoderConfig.moe_experts`; "auto": dense on CPU, on a GPU the ragged forward with the dense
form's gradient): dense (every expert on every token, `models.moe.experts_swiglu`) does E / k times
the needed FLOPs (16x at 128 experts, top-8); the ragged forward (grouped matmuls) the needed ones. The row also gives
"dense_work_tflops" and "mfu_dense_work", the same count with all E experts: the dense form's work.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.benchmarks.gpu.gpu_check_report import Report, _pct
from jaxrl_llm.benchmarks.gpu.gpu_check_sections import (DEFAULT_BUDGET_S, batch_invariance_check, run_order,
                                                     section_estimates, torch_rates, torch_reference)
from jaxrl_llm.benchmarks.common.model_shapes import MOE_MODELS, model_config
from jaxrl_llm.benchmarks.common.results import RESULTS_DIR
from jaxrl_llm.benchmarks.gpu.learner_gpu import datasheet_peak, matmul_ceiling
from jaxrl_llm.benchmarks.gpu.learner_phases import learner_phases
from jaxrl_llm.benchmarks.common.rl_batch import TINY_MIX, LengthMix, learner_flops, rl_length_mix
from jaxrl_llm.benchmarks.common.timing import interleaved_times, median_seconds
from jaxrl_llm.models import init_params
from jaxrl_llm.models.fused_attention import SEGMENTS_SWITCH
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner

SEGMENT_TOLERANCE = 2e-2  # relative error vs float32 that bf16 attention stays well under (METHOD: 1e-3..1e-2)


# ---------------------------------------------------------------- learner rows
def learner_row(model: str, tokens_per_step: int, pack: bool, *, micro_batch_tokens: int, steps: int,
                mix: LengthMix, peak_tflops: float | None, ceiling_flops: float | None,
                remat: str = "auto") -> dict[str, Any]:
    """`Learner.update` on one RL-like step: median seconds over `steps` after a warm-up (compile)."""
    cfg = model_config(model, mix.prompt_width + mix.completion_width)
    seq, rewards = rl_length_mix(tokens_per_step, mix, cfg.vocab_size)
    train_cfg = dataclasses.replace(TrainConfig(), precision="bf16", lr=1e-6, pack=pack, remat=remat,
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
    if cfg.is_moe:
        row.update(moe_fields(cfg, flops, seconds, peak_tflops))
    return row


AUTO_OFF_CPU = "ragged forward, dense gradient"  # models.moe.experts_ragged_dense_grad


def experts_form(setting: str, backend: str) -> str:
    """The form `DecoderConfig.moe_experts` takes on this backend ("auto": dense on CPU, else AUTO_OFF_CPU)."""
    return ("dense" if backend == "cpu" else AUTO_OFF_CPU) if setting == "auto" else setting


def expert_work_over_needed(form: str, experts: int, top_k: int) -> float | None:
    """The experts' FLOPs of a learner update over the needed ones: dense E / k; the ragged forward with
    the dense gradient (1 + 3 E / k) / 3 (the forward, then the dense forward again and its backward);
    ragged None (its weight gradient costs what the compiler's ragged_dot transpose does)."""
    dense = experts / top_k
    return {"dense": dense, AUTO_OFF_CPU: (1 + 3 * dense) / 3}.get(form)


def moe_fields(cfg, flops: dict[str, float], seconds: float, peak_tflops: float | None) -> dict[str, Any]:
    """A mixture-of-experts row's extra numbers: MFU is on active parameters (the row's "mfu"); in the
    dense form the dense-work rate (all E experts counted) is what the device achieved."""
    dense = flops["dense_work_flops"] / seconds
    form = experts_form(cfg.moe_experts, jax.default_backend())
    return {"moe": True, "mfu_basis": "active parameters", "params": cfg.num_params(), "experts_form": form,
            "active_params": cfg.num_active_params(), "experts": cfg.num_experts, "top_k": cfg.num_experts_per_tok,
            "expert_work_over_needed": expert_work_over_needed(form, cfg.num_experts, cfg.num_experts_per_tok),
            "dense_work_flops_per_step": flops["dense_work_flops"], "dense_work_tflops": dense / 1e12,
            "mfu_dense_work": None if peak_tflops is None else dense / (peak_tflops * 1e12)}


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


def learner_plan(tiny: bool) -> list[tuple[str, int, bool]]:
    """(model, tokens per step, pack), the headline row first, then the one torch is compared with."""
    if tiny:
        return [("tiny", 256, True), ("tiny", 256, False), ("tiny-moe", 256, True)]
    return [("qwen2.5-1.5b", 65536, True), ("qwen2.5-1.5b", 16384, False), ("qwen2.5-1.5b", 16384, True),
            ("qwen2.5-1.5b", 65536, False), ("qwen3-30b-a3b-4l", 16384, True), ("qwen2.5-0.5b", 65536, True), ("qwen2.5-0.5b", 65536, False),
            ("qwen2.5-0.5b", 16384, True), ("qwen2.5-0.5b", 16384, False)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", default=str(RESULTS_DIR))
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="the whole run, torch included: sections that would not fit are skipped")
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
    jobs = section_jobs(args, report)
    names = [name for name in run_order(*job_names(args.tiny)) if wanted(name)]
    estimates = section_estimates(names, tiny=args.tiny, results_dir=Path(args.out_dir),
                                  device_kind=report.data["device"])
    report.data["estimates_s"] = estimates
    for name in names:
        result = report.section(name, estimates[name], jobs[name])
        group = name.split(":")[0]
        if group == "sampler":
            report.data.setdefault("sampler", []).extend([] if result is None else [result])
        elif group in ("attention", "batch_invariance", "rl_run", "rl_step", "learner_phases"):
            report.data[group] = result
        report.write()
    print(report.path.with_suffix(".md").read_text(), flush=True)
    return 0


def job_names(tiny: bool) -> tuple[list[str], list[str]]:
    """The learner rows' and the sampler sections' names, in their plan's order."""
    learner = [f"learner:{model}:{tokens}:{'packed' if pack else 'rows'}" for model, tokens, pack in learner_plan(tiny)]
    return learner, [f"sampler:{batch}" for batch in sampler_batches(tiny)]


def sampler_batches(tiny: bool) -> tuple[int, ...]:
    return (4, 8) if tiny else (64, 256)


def section_jobs(args, report: Report) -> dict[str, Callable[[], Any]]:
    """Section name -> the call that measures it."""
    tiny = args.tiny
    mix = TINY_MIX if tiny else LengthMix()
    micro_tokens = 2 * (mix.prompt_width + mix.completion_width) if tiny else args.micro_batch_tokens
    peak = datasheet_peak(report.data["device"], "bf16")
    ceilings: dict[str, Any] = {"peak_tflops": peak}

    def measure_ceilings():
        ceilings["matmul_tflops"] = matmul_ceiling("bfloat16", 256 if tiny else 8192, 5) / 1e12
        from jaxrl_llm.benchmarks.gpu.gpu_sampler import copy_bandwidth

        ceilings["copy_gb_s"] = copy_bandwidth(2 ** 22 if tiny else 2 ** 30)["copy_bandwidth_Bps"] / 1e9
        report.data["ceilings"] = ceilings
        return ceilings

    def attention():
        try:
            result = attention_check()
        except Exception:
            disable_segments(report)  # the segment-aware call failed: the learner rows use the mask path
            raise
        errors = result.get("cudnn_segments", {})
        if "skipped" not in result and not all(errors.get(part, 1.0) < SEGMENT_TOLERANCE
                                               for part in ("out", "dq", "dk", "dv")):
            disable_segments(report)  # disagrees with float32: the learner rows use the mask path
        return result

    def gpu_rl():  # imported by the sections that use it: an import error fails those sections only
        from jaxrl_llm.benchmarks.gpu import gpu_rl as module
        return module

    def sampler(batch):
        from jaxrl_llm.benchmarks.gpu import gpu_sampler
        return gpu_sampler.sampler_decode("tiny" if tiny else "qwen2.5-1.5b", batch, 8 if tiny else 512, tiny=tiny,
                                          repeats=1)

    work = Path(tempfile.mkdtemp(prefix="gpu_check_rl_"))  # the RL run's model and run folders, not results
    jobs: dict[str, Callable[[], Any]] = {
        "ceilings": measure_ceilings, "attention": attention,
        "batch_invariance": lambda: batch_invariance_check(tiny),
        "learner_phases": lambda: learner_phases(micro_batch_tokens=micro_tokens, tiny=tiny, levers=True,
                                                 matmul_tflops=ceilings.get("matmul_tflops")),
        "rl_run": lambda: gpu_rl().rl_end_to_end(work, tiny=tiny, tokenizer_dir=args.tokenizer_dir),
        "rl_step": lambda: gpu_rl().rl_step_at_scale(tiny=tiny, remat="auto")}
    jobs.update({f"sampler:{batch}": lambda batch=batch: sampler(batch) for batch in sampler_batches(tiny)})
    for model, tokens, pack in learner_plan(tiny):
        jobs[f"learner:{model}:{tokens}:{'packed' if pack else 'rows'}"] = _learner_job(
            report, model, tokens, pack, micro_tokens, args.steps, mix, peak, ceilings)
    return jobs


def disable_segments(report: Report) -> None:
    os.environ[SEGMENTS_SWITCH] = "0"
    report.data["cudnn_segments_disabled"] = True
    report.write()


def _learner_job(report: Report, model, tokens, pack, micro_tokens, steps, mix, peak, ceilings):
    def job():
        ceiling = ceilings.get("matmul_tflops")
        micro = micro_tokens // 2 if model in MOE_MODELS and model != "tiny-moe" else micro_tokens
        row = learner_row(model, tokens, pack, micro_batch_tokens=micro, steps=steps, mix=mix,
                          peak_tflops=peak, ceiling_flops=None if ceiling is None else ceiling * 1e12)
        report.data["learner"].append(row)
        moe = (f" (active params; dense expert work {row['dense_work_tflops']:.1f} TFLOP/s, "
               f"MFU {_pct(row['mfu_dense_work'])})") if row.get("moe") else ""
        print(f"[gpu-check]   {model} {row['tokens_per_step']} tok {'packed' if pack else 'rows'}: "
              f"{row['seconds']:.3f} s/step, {row['tokens_per_s']:.0f} tok/s, MFU {_pct(row['mfu'])}{moe}, "
              f"padding {_pct(row['padding_fraction'])}, remat {row['remat']}", flush=True)
        return row
    return job


if __name__ == "__main__":
    raise SystemExit(main())
