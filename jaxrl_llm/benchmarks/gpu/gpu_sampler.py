"""The JAX sampler's decode throughput on a device, against its memory-bandwidth roofline.

`sampler_decode(shape, batch, new_tokens)`: the JAX sampler (`rollout.jax_sampler.JaxSampler`)
at a `benchmarks.common.model_shapes.MODELS` shape with random weights. EOS is made impossible so every
row decodes exactly `new_tokens`: the stop id is `vocab_size`, one past the last token id, and
the sampler draws ids in [0, vocab_size) only (`inverse_cdf_choice` never returns a padded
slot), so no row ever stops (checked on the output). The prefill (the library's `forward`
over the prompts with a fresh KV cache, LM head on the last position) is timed alone, the
whole `generate` call after it; decode time = generate - prefill. Compile (the first call)
is excluded and reported. Reported: decode tokens/s and the memory-bandwidth roofline
fraction (`ROOFLINE_FORMULA`) against `copy_bandwidth()`, the device's measured
device-to-device copy bandwidth. `make gpu-check` runs it (`benchmarks.gpu.gpu_check`); ``tiny=True``
runs it at a tiny size on CPU (the tests), where its numbers mean nothing for GPUs.
"""
from __future__ import annotations

import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.common.model_shapes import model_config
from jaxrl_llm.benchmarks.common.timing import interleaved_times, log, median_seconds

ROOFLINE_FORMULA = (
    "roofline_fraction = steps * (weight_bytes + kv_bytes_per_step) / decode_s / copy_bandwidth_Bps; "
    "steps = new_tokens (decode forwards, one per generated token); weight_bytes = bytes of every parameter "
    "(tied LM head counted once; an untied input embedding is a row lookup and not counted); "
    "kv_bytes_per_step = mean over decode steps t = 0..steps-1 of the K and V slots attended, "
    "2 * num_layers * num_kv_heads * head_dim * itemsize * batch * (prompt_len + t + 1), "
    "= 2 * num_layers * num_kv_heads * head_dim * itemsize * batch * (prompt_len + (steps + 1) / 2); "
    "copy_bandwidth_Bps = (read + write bytes) / s of a large device-to-device copy (median)")


def device_kind() -> str:
    return str(jax.devices()[0].device_kind)


# ------------------------------------------------------------------ bandwidth
_BANDWIDTH: dict[tuple[int, int], dict[str, Any]] = {}


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 10) -> dict[str, Any]:
    """Device-to-device copy bandwidth: a jitted y = x + 1 over a float32 array of `nbytes`
    (one read and one write of every element; a plain copy the compiler might elide), median
    seconds over `repeats` calls after one warm-up, (read + write bytes) / s. Cached per size."""
    key = (int(nbytes), int(repeats))
    if key in _BANDWIDTH:
        return _BANDWIDTH[key]
    n = max(1, int(nbytes) // 4)
    x = jnp.zeros((n,), jnp.float32)
    bump = jax.jit(lambda a: a + jnp.float32(1))
    seconds = median_seconds(lambda: bump(x).block_until_ready(), repeats)
    out = {"copy_bandwidth_Bps": 2.0 * n * 4 / seconds, "copy_bytes": int(n * 4), "copy_seconds_median": seconds,
           "copy_repeats": int(repeats), "device_kind": device_kind()}
    _BANDWIDTH[key] = out
    return out


# -------------------------------------------------------------------- sampler
def param_bytes(cfg, dtype: str) -> int:
    """Bytes of the weights one decode step reads: every parameter in `dtype`, except an untied
    input embedding (only the rows of the batch's tokens are read)."""
    from jaxrl_llm.models import param_shapes

    shapes = param_shapes(cfg, dtype)
    total = sum(int(np.prod(x.shape)) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(shapes))
    if not cfg.tie_word_embeddings:
        total -= int(np.prod(shapes["embed"].shape)) * jnp.dtype(shapes["embed"].dtype).itemsize
    return int(total)


def kv_bytes_per_step(cfg, dtype: str, batch: int, prompt_len: int, steps: int) -> float:
    """Mean bytes of K and V read per decode step (see `ROOFLINE_FORMULA`)."""
    per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(dtype).itemsize
    return float(per_slot * batch * (prompt_len + (steps + 1) / 2))


def random_prompts(vocab: int, rows: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(rows, length)).tolist()


def impossible_eos(cfg) -> list[int]:
    """A stop id the sampler can never draw: it samples ids in [0, vocab_size)."""
    return [cfg.vocab_size]


def sampler_config(shape: str, prompt_len: int, new_tokens: int, dtype: str):
    return model_config(shape, prompt_len + new_tokens).with_dtypes(param_dtype=dtype, compute_dtype=dtype)


def check_full_length(rollouts, new_tokens: int) -> None:
    lengths = {r.num_completion_tokens for r in rollouts.records}
    reasons = {r.finish_reason for r in rollouts.records}
    if lengths != {new_tokens} or reasons != {"length"}:
        raise RuntimeError(f"expected every row to decode {new_tokens} tokens, got lengths {sorted(lengths)} and "
                           f"finish reasons {sorted(reasons)}")


def sampler_decode(shape: str, batch: int, new_tokens: int, *, dtype: str = "bfloat16", prompt_len: int = 128,
                   tiny: bool = False, repeats: int = 2, bandwidth: dict | None = None,
                   seed: int = 0, sampler_options: dict | None = None) -> dict[str, Any]:
    """Decode throughput of the JAX sampler at `shape` (random weights), `batch` distinct prompts
    of `prompt_len` random tokens, exactly `new_tokens` generated per row (EOS impossible), at
    temperature 1. Median over `repeats` timed calls after a warm-up (compile) call.
    ``tiny``: the 'tiny' shape, batch <= 8, new_tokens <= 8, prompt_len <= 16, an 8 MiB copy.
    ``sampler_options``: keyword arguments of `JaxSampler` (e.g. decode, decode_kernel), recorded."""
    from jaxrl_llm.models import forward, init_cache, init_params, lm_head_logits
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams

    if tiny:
        shape, batch, new_tokens, prompt_len = "tiny", min(batch, 8), min(new_tokens, 8), min(prompt_len, 16)
    bandwidth = bandwidth or copy_bandwidth(8 << 20 if tiny else 1 << 30)
    cfg = sampler_config(shape, prompt_len, new_tokens, dtype)
    log(f"sampler_decode {shape} {dtype}: batch {batch} x {new_tokens} new tokens, prompts of {prompt_len}")
    params = init_params(cfg, jax.random.key(seed), dtype=dtype)
    sampler = JaxSampler(cfg, params, eos_token_ids=impossible_eos(cfg), pad_id=0, **(sampler_options or {}))
    prompts = random_prompts(cfg.vocab_size, batch, prompt_len, seed + 1)
    sampling = SamplingParams(temperature=1.0, max_tokens=new_tokens, seed=seed)

    tokens = jnp.asarray(np.asarray(prompts, np.int32))
    mask = jnp.ones(tokens.shape, bool)

    @jax.jit
    def prefill(params, tokens, mask):
        cache = init_cache(cfg, tokens.shape[0], tokens.shape[1])
        hidden, cache = forward(params, cfg, tokens, attention_mask=mask, cache=cache, return_hidden=True)
        return lm_head_logits(hidden[:, -1], params, cfg), cache

    def run_prefill():
        jax.block_until_ready(prefill(params, tokens, mask))

    def run_generate():
        return sampler.generate(prompts, n=1, params=sampling)  # device_get inside: blocks

    t0 = time.perf_counter()
    run_prefill()
    prefill_first = time.perf_counter() - t0
    t0 = time.perf_counter()
    rollouts = run_generate()
    generate_first = time.perf_counter() - t0
    check_full_length(rollouts, new_tokens)
    log(f"  warm-up: prefill {prefill_first:.2f} s, generate {generate_first:.2f} s (compiles included)")
    outputs = []
    times = interleaved_times({"prefill": run_prefill, "generate": lambda: outputs.append(run_generate())}, 0, repeats)
    prefill_times, generate_times = times["prefill"], times["generate"]
    for i, rollouts in enumerate(outputs):
        check_full_length(rollouts, new_tokens)
        log(f"  run {i + 1}/{repeats}: prefill {prefill_times[i]:.3f} s, generate {generate_times[i]:.3f} s")
    prefill_s = float(np.median(prefill_times))
    total_s = float(np.median(generate_times))
    decode_s = max(total_s - prefill_s, 1e-9)
    generated = batch * new_tokens
    weights = param_bytes(cfg, dtype)
    kv = kv_bytes_per_step(cfg, dtype, batch, prompt_len, new_tokens)
    achieved = new_tokens * (weights + kv) / decode_s
    out = {
        "shape": shape, "dtype": dtype, "batch": int(batch), "new_tokens": int(new_tokens),
        "prompt_len": int(prompt_len), "repeats": int(repeats), "device_kind": device_kind(),
        "decode": sampler.decode, "decode_kernel": sampler.decode_kernel if sampler.decode == "slots" else None,
        "eos": "stop id = vocab_size (never drawn: ids are sampled in [0, vocab_size)); every row checked to "
               "decode new_tokens tokens",
        "prefill_s": prefill_s, "generate_s": total_s, "decode_s": decode_s, "prefill_fraction": prefill_s / total_s,
        "decode_tokens_per_s": generated / decode_s, "total_tokens_per_s": generated / total_s,
        "decode_ms_per_step": 1e3 * decode_s / new_tokens,
        "compile_s": max(prefill_first - prefill_s, 0.0) + max(generate_first - total_s, 0.0),
        "weight_bytes": int(weights), "kv_bytes_per_step": kv,
        "achieved_bandwidth_Bps": achieved, **bandwidth,
        "roofline_fraction": achieved / bandwidth["copy_bandwidth_Bps"], "roofline_formula": ROOFLINE_FORMULA,
        "timing_note": "decode_s = generate_s - prefill_s (floored at 1 ns), both medians; generate includes "
                       "the host-side batching and the device_get of the outputs; at tiny sizes the two are "
                       "sub-millisecond and the difference is noise",
    }
    log(f"  {out['decode_tokens_per_s']:.1f} decode tok/s, {out['decode_ms_per_step']:.2f} ms/step, "
         f"roofline {out['roofline_fraction']:.1%} of {bandwidth['copy_bandwidth_Bps'] / 1e9:.1f} GB/s")
    return out



SWEEP_KERNELS = ("dense", "cudnn", "pallas")


def sweep_variants(batches, cache_lengths, paths, kernels) -> list[dict[str, Any]]:
    """Every (batch, cache length, decode path, kernel) to run; the compacting path has one kernel
    (its windowed dense attention), so it appears once per (batch, cache length)."""
    variants = []
    for batch in batches:
        for cache in cache_lengths:
            for path in paths:
                for kernel in (kernels if path == "slots" else ("windowed-dense",)):
                    variants.append({"batch": int(batch), "cache_length": int(cache), "decode": path, "kernel": kernel})
    return variants


def sampler_sweep(*, shape: str = "qwen2.5-1.5b", dtype: str = "bfloat16", batches=(64, 256),
                  cache_lengths=(1024, 2048), paths=("compact", "slots"), kernels=SWEEP_KERNELS,
                  prompt_len: int = 128, repeats: int = 2, tiny: bool = False, seed: int = 0) -> list[dict[str, Any]]:
    """The sampler's decode at every variant of `sweep_variants`, in one call: for each, a record with
    the variant and `sampler_decode`'s numbers (decode tokens/s, compile_s, roofline_fraction, ...)
    or, where the variant failed (a kernel the device lacks), its ``error``. new_tokens = cache
    length - prompt_len (every row decodes to the cache's end). One copy-bandwidth measurement
    serves every variant. ``tiny``: on CPU with the tiny model (batches {2, 4}, a cache of 32 slots,
    prompts of 16, kernels dense and pallas (interpreted); cuDNN needs an NVIDIA GPU)."""
    if tiny:
        shape, dtype, batches, cache_lengths, prompt_len = "tiny", "float32", (2, 4), (32,), 16
        kernels = tuple(k for k in kernels if k != "cudnn")
    bandwidth = copy_bandwidth(8 << 20 if tiny else 1 << 30)
    records = []
    for variant in sweep_variants(batches, cache_lengths, paths, kernels):
        options = {"decode": variant["decode"]}
        if variant["decode"] == "slots":
            options["decode_kernel"] = variant["kernel"]
        try:
            out = sampler_decode(shape, variant["batch"], variant["cache_length"] - prompt_len, dtype=dtype,
                                 prompt_len=prompt_len, repeats=repeats, bandwidth=bandwidth, seed=seed,
                                 sampler_options=options)
        except Exception as error:  # noqa: BLE001 - a sweep records every variant, failed ones too
            log(f"  {variant}: {type(error).__name__}: {error}")
            out = {"error": f"{type(error).__name__}: {str(error)[:500]}"}
        records.append({**variant, "shape": shape, "dtype": dtype, **out})
    return records


def main(argv: list[str] | None = None) -> int:
    """``python -m jaxrl_llm.benchmarks.gpu.gpu_sampler --out FILE [--tiny]``: `sampler_sweep` to a JSON file."""
    import argparse
    import json

    parser = argparse.ArgumentParser(description="the JAX sampler's decode sweep (sampler_sweep)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--tiny", action="store_true", help="tiny model on CPU (checks the sweep runs)")
    args = parser.parse_args(argv)
    records = sampler_sweep(tiny=args.tiny, repeats=1 if args.tiny else 2)
    with open(args.out, "w") as f:
        json.dump({"formula": ROOFLINE_FORMULA, "records": records}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
