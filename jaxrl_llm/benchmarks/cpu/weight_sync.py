"""Weight-sync cost against model size: export -> reload -> verify into a real vLLM CPU server.

    python -m jaxrl_llm.benchmarks.cpu.weight_sync [--models smollm2-135m,qwen2.5-0.5b,qwen2.5-1.5b]
                                               [--dtype bfloat16] [--warmup 2] [--iters 3] [--out FILE]

For each model one vLLM CPU server is started on it and a `VLLMEngine` over a
`DiskWeightSync` pushes alternating weight versions (the second differs in the final
norm, so every push changes what the server computes): `--warmup` untimed pushes
(the first two write new staging files; from the third on a push rewrites the copy
of the push before last in place, the steady state of training), then `--iters`
timed rounds. Each round is one in-line push and one overlapped push (order
alternating between rounds), each followed by the "next step", a generate of
`--step-prompts` x 2 samples x `--step-tokens` tokens. Phases, as
`WeightSyncReport` measures them:

  export  the bridge writes HF safetensors to /dev/shm (`bridge_export`);
  reload  vLLM's reload_weights RPC + prefix-cache reset + version label;
  verify  the learner's probe logprobs (computed during the reload), the probe
          request to the server and the comparison, timed from the reload's end;
  wait    overlapped only: how long the next generate, after sampling, still
          waited for the probe (`VLLMEngine.last_verify_wait_s`).

Columns are medians over pushes (a total is the median of the pushes' totals, not
the sum of the phase medians); push + step is the end-to-end cost a synchronous
loop pays, so a probe that slows the generate beside it shows there.

The critical path of a push is what the loop waits for before it can use the
next batch: export + reload + verify in line, export + reload + wait overlapped
(`VLLMEngine(overlap_verify=True)`, the probe running beside the next generate).

SmolLM2-135M uses its real weights; the Qwen2.5 models are random weights in
the published shapes (Qwen2: q/k/v biases, tied embeddings at these sizes,
vocabulary 151,936), served with SmolLM2's tokenizer (the probe's token ids
are below its vocabulary). Then a least-squares line over the models gives
each phase's cost per GB of staged file, the basis of docs/benchmarks.md's projection
for larger models. A model whose estimated peak memory (`peak_memory`: learner,
server, two staged copies on /dev/shm) exceeds MemAvailable is refused before
anything starts, in one line giving both.

Numbers depend on load: the machine's cores are shared; the load average is
printed beside them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.bridge import load_hf_dir, save_hf_dir, smollm2_hf_dir
from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.rollout import (DiskWeightSync, LogprobProbe, SamplingParams, VLLMClient, VLLMEngine, VLLMServer,
                               VLLMServerConfig, bridge_export)

# Published shapes (config.json of Qwen/Qwen2.5-0.5B and Qwen/Qwen2.5-1.5B).
QWEN25_SHAPES = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14, num_kv_heads=2,
                         head_dim=64),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12, num_kv_heads=2,
                         head_dim=128),
}
MODELS = ("smollm2-135m", *QWEN25_SHAPES)
# Per-token tolerance of the probe by server dtype (see benchmarks/cpu/rollout.py).
PROBE_ATOL = {"float32": 2e-3, "bfloat16": 1.0}
# Fixed token ids, below every vocabulary here (SmolLM2's tokenizer has 49,152).
PROBE_TOKENS = (1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411)


@dataclasses.dataclass(frozen=True)
class SizeResult:
    model: str
    params: int
    file_bytes: int
    startup_s: float
    first_push: dict  # phases of the first push (a new staging file)
    export_s: float  # medians of the timed pushes
    reload_s: float
    verify_s: float
    total_s: float
    learner_probe_s: float  # the learner's probe logprobs alone
    probe_max_abs_diff: float
    load_before: float
    load_after: float
    overlapped: dict  # medians of the overlapped pushes: export_s, reload_s, verify_s, wait_s, critical_s
    step_inline_s: float  # median next generate after an in-line push
    step_overlapped_s: float  # ... after an overlapped push (includes its wait)
    step_tokens: float  # median completion tokens of a next step
    cycle_inline_s: float  # median push + next step, in line
    cycle_overlapped_s: float  # ... overlapped


@dataclasses.dataclass(frozen=True)
class MemoryNeed:
    """Estimated peak resident memory of one model's benchmark (bytes)."""

    learner: int  # params in the learner dtype + the probe's XLA buffers + the JAX runtime
    server: int  # vLLM's copy in the served dtype + its KV cache + the server process
    staged: int  # two staged copies on /dev/shm (the current push and the spare it rewrites)

    @property
    def total(self) -> int:
        return self.learner + self.server + self.staged

    def refusal(self, name: str, available: int) -> str | None:
        """None when it fits in `available`, else one line saying why not."""
        if self.total <= available:
            return None
        gib = lambda b: b / 2 ** 30  # noqa: E731
        return (f"{name}: refused, estimated peak {gib(self.total):.1f} GiB (learner {gib(self.learner):.1f} + server "
                f"{gib(self.server):.1f} + /dev/shm {gib(self.staged):.1f}) > MemAvailable {gib(available):.1f} GiB")


def qwen25_config(name: str, dtype: str) -> DecoderConfig:
    return DecoderConfig(vocab_size=151936, family="qwen2", qkv_bias=True, tie_word_embeddings=True,
                         rope_theta=1_000_000.0, rms_norm_eps=1e-6, max_position_embeddings=32768,
                         param_dtype=dtype, compute_dtype=dtype, **QWEN25_SHAPES[name])


def build_model(name: str, dtype: str) -> tuple[DecoderConfig, dict]:
    """(config, params; both dtypes `dtype`): SmolLM2's real weights, or random Qwen2.5-shaped ones."""
    if name == "smollm2-135m":
        cfg, params = load_hf_dir(smollm2_hf_dir(), dtype=dtype)
        return cfg.with_dtypes(dtype, dtype), jax.tree.map(jnp.asarray, params)
    if name not in QWEN25_SHAPES:
        raise ValueError(f"model {name!r}; valid: {list(MODELS)}")
    cfg = qwen25_config(name, dtype)
    return cfg, init_params(cfg, jax.random.PRNGKey(0))


# Calibrated on the Qwen2.5-1.5B shape (bfloat16 server and files, float32 learner), which was
# OOM-killed at ~19 GiB resident: learner 7.4 GiB (5.75 GiB of params), server 5.6 GiB (2.9 GiB of
# weights + 1 GiB KV cache), /dev/shm 5.8 GiB (two 2.9 GiB copies).
LEARNER_OVERHEAD = (1.2, 0.5 * 2 ** 30)  # (x params, + bytes)
SERVER_OVERHEAD = int(1.7 * 2 ** 30)  # beyond weights and KV cache
KV_CACHE_GIB = 1


def peak_memory(cfg: DecoderConfig, dtype: str, learner_dtype: str) -> MemoryNeed:
    """The benchmark's estimated peak for a model of `cfg`'s shape (see the calibration above)."""
    count = cfg.num_params()
    learner_bytes, model_bytes = (count * np.dtype(jnp.dtype(d)).itemsize for d in (learner_dtype, dtype))
    scale, extra = LEARNER_OVERHEAD
    return MemoryNeed(learner=int(scale * learner_bytes + extra),
                      server=model_bytes + KV_CACHE_GIB * 2 ** 30 + SERVER_OVERHEAD, staged=2 * model_bytes)


def mem_available_bytes() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fit_per_gb(gbs: list[float], seconds: list[float]) -> tuple[float, float]:
    """(intercept s, slope s/GB) of the least-squares line through (GB, seconds)."""
    slope, intercept = np.polyfit(np.asarray(gbs), np.asarray(seconds), 1)
    return float(intercept), float(slope)


def step_prompts(count: int) -> list[list[int]]:
    """`count` prompts of the probe's ids (8, 9, ... tokens long): below every vocabulary here."""
    return [list(PROBE_TOKENS[:8 + i % 8]) for i in range(count)]


def bench_model(name: str, dtype: str, warmup: int, iters: int, learner_dtype: str = "float32",
                step_prompt_count: int = 4, step_tokens: int = 32) -> SizeResult | str:
    """One server on `name`, its pushes timed; a string saying why when refused for memory."""
    cfg = qwen25_config(name, dtype) if name in QWEN25_SHAPES else None
    if cfg is not None:  # before anything is built: a model that does not fit is refused, not OOM-killed
        refusal = peak_memory(cfg, dtype, learner_dtype).refusal(name, mem_available_bytes())
        if refusal:
            return refusal
    cfg, params_a = build_model(name, learner_dtype)
    params_b = dict(params_a, final_norm=params_a["final_norm"] * 1.25)  # shares every other leaf
    # Computed in the learner's dtype: a float32 pass over bfloat16 params lets XLA hold a float32
    # copy of every weight at once (9 GB for the 1.5B model), more than the sync itself needs.
    score = jax.jit(lambda p, t: token_logprobs(p, cfg, t))
    tokens = jnp.asarray(np.asarray(PROBE_TOKENS, np.int32)[None])
    probe = LogprobProbe(PROBE_TOKENS, lambda p: np.asarray(score(p, tokens))[0], atol=PROBE_ATOL[dtype])
    probe.expected(params_a)  # compile outside the timings
    start = time.perf_counter()
    probe.expected(params_b)
    learner_probe_s = time.perf_counter() - start
    prompts = step_prompts(step_prompt_count)
    sampling = SamplingParams(max_tokens=step_tokens, seed=0)

    root = Path(tempfile.mkdtemp(prefix=f"jaxrl-sync-bench-{name}-"))  # the server's initial copy: on disk
    try:
        model_dir = save_hf_dir(cfg, params_a, root / "model", dtype=dtype, tokenizer_dir=smollm2_hf_dir(),
                                fsync=False)
        file_bytes = os.path.getsize(Path(model_dir) / "model.safetensors")
        config = VLLMServerConfig(model_dir=model_dir, dtype=dtype, max_model_len=128, kv_cache_gib=KV_CACHE_GIB,
                                  enforce_eager=True)
        start = time.perf_counter()
        with VLLMServer(config) as server:
            startup_s = time.perf_counter() - start
            client = VLLMClient([server.url])
            with DiskWeightSync(client, bridge_export(cfg, dtype), probe=probe) as sync, \
                    VLLMEngine(client, sync, servers=[server]) as engine:
                engine.generate(prompts, 2, sampling)  # the server's first generate, untimed
                reports = [push_and_step(engine, params_b if v % 2 else params_a, False, prompts, sampling)
                           for v in range(1, warmup + 1)]
                load_before = os.getloadavg()[0]
                rounds = []
                for i in range(iters):
                    for overlap in ((False, True) if i % 2 == 0 else (True, False)):
                        params = params_b if (warmup + len(rounds)) % 2 == 0 else params_a  # differs from the last
                        rounds.append(push_and_step(engine, params, overlap, prompts, sampling))
                load_after = os.getloadavg()[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    inline = [r for r in rounds if not r.overlapped]
    overlapped = [r for r in rounds if r.overlapped]
    first = (reports or rounds)[0].report

    def median(rows, value) -> float:
        return statistics.median(value(r) for r in rows)

    return SizeResult(
        name, cfg.num_params(), file_bytes, startup_s,
        {"export_s": first.export_s, "reload_s": first.reload_s, "verify_s": first.verify_s},
        median(inline, lambda r: r.report.export_s), median(inline, lambda r: r.report.reload_s),
        median(inline, lambda r: r.report.verify_s), median(inline, lambda r: r.report.total_s),
        learner_probe_s, max(r.report.probe_max_abs_diff for r in reports + rounds), load_before, load_after,
        {"export_s": median(overlapped, lambda r: r.report.export_s),
         "reload_s": median(overlapped, lambda r: r.report.reload_s),
         "verify_s": median(overlapped, lambda r: r.report.verify_s),
         "wait_s": median(overlapped, lambda r: r.wait_s), "critical_s": median(overlapped, lambda r: r.critical_s)},
        median(inline, lambda r: r.step_s), median(overlapped, lambda r: r.step_s),
        median(rounds, lambda r: r.step_tokens), median(inline, lambda r: r.cycle_s),
        median(overlapped, lambda r: r.cycle_s))


@dataclasses.dataclass(frozen=True)
class PushAndStep:
    """One push and the generate after it."""

    overlapped: bool
    report: object  # WeightSyncReport
    wait_s: float  # the generate's wait for the probe (0 in line)
    step_s: float  # the generate's wall time, wait included
    step_tokens: int

    @property
    def critical_s(self) -> float:
        """What the loop waits for before it has the next batch, beyond the generate's own sampling."""
        r = self.report
        return r.export_s + r.reload_s + (self.wait_s if self.overlapped else r.verify_s)

    @property
    def cycle_s(self) -> float:
        """Push + next step, end to end: what a synchronous loop pays (the step includes the wait)."""
        r = self.report
        return r.export_s + r.reload_s + (0.0 if self.overlapped else r.verify_s) + self.step_s


def push_and_step(engine: VLLMEngine, params, overlap: bool, prompts, sampling) -> PushAndStep:
    engine.overlap_verify = overlap
    engine.update_weights(params)
    start = time.perf_counter()
    batch = engine.generate(prompts, 2, sampling)
    step_s = time.perf_counter() - start
    report = engine.last_sync
    if report is None or report.version != engine.weight_version:
        raise RuntimeError(f"push {engine.weight_version} has no verified report after its generate: {report}")
    return PushAndStep(overlap, report, engine.last_verify_wait_s if overlap else 0.0, step_s,
                       sum(r.num_completion_tokens for r in batch.records))


def print_table(results: list[SizeResult], dtype: str, warmup: int, iters: int) -> dict:
    print(f"weight sync against model size: vLLM CPU {dtype} server, {dtype} files on /dev/shm, median of "
          f"{iters} in-line pushes after {warmup} warm-up pushes (in-place rewrites)")
    print(f"  {'model':<14} {'params':>7} {'file MiB':>9} {'export s':>9} {'reload s':>9} {'verify s':>9} "
          f"{'total s':>8} {'learner probe s':>16} {'first push s':>13} {'server start s':>15} {'load':>10}")
    for r in results:
        first = sum(r.first_push.values())
        print(f"  {r.model:<14} {r.params / 1e9:6.2f}B {r.file_bytes / 2 ** 20:9.0f} {r.export_s:9.2f} "
              f"{r.reload_s:9.2f} {r.verify_s:9.2f} {r.total_s:8.2f} {r.learner_probe_s:16.2f} {first:13.2f} "
              f"{r.startup_s:15.1f} {r.load_before:4.1f}->{r.load_after:<4.1f}")
    print(f"  in line vs overlapped verify (VLLMEngine(overlap_verify=True)), medians over {iters} of each; "
          "critical path = export + reload + verify (in line) or + wait (overlapped); next step = a generate "
          "of the tokens shown")
    print(f"  {'model':<14} {'in line: exp':>12} {'reload':>7} {'verify':>7} {'critical':>9} | "
          f"{'overlapped: exp':>15} {'reload':>7} {'verify*':>8} {'wait':>6} {'critical':>9} | "
          f"{'next step in line':>17} {'overlapped':>10} {'tokens':>6} | {'push+step in line':>17} {'overlapped':>10}")
    for r in results:
        o = r.overlapped
        print(f"  {r.model:<14} {r.export_s:12.2f} {r.reload_s:7.2f} {r.verify_s:7.2f} {r.total_s:9.2f} | "
              f"{o['export_s']:15.2f} {o['reload_s']:7.2f} {o['verify_s']:8.2f} {o['wait_s']:6.2f} "
              f"{o['critical_s']:9.2f} | {r.step_inline_s:17.2f} {r.step_overlapped_s:10.2f} {r.step_tokens:6.0f} | "
              f"{r.cycle_inline_s:17.2f} {r.cycle_overlapped_s:10.2f}")
    print("  (* overlapped verify: the probe's own time, beside the next generate)")
    fits = {}
    if len(results) >= 2:
        gbs = [r.file_bytes / 1e9 for r in results]
        for phase in ("export_s", "reload_s", "verify_s", "total_s"):
            fits[phase] = fit_per_gb(gbs, [getattr(r, phase) for r in results])
        print("  linear fit over these models, seconds = a + b * GB of staged file:  " + ";  ".join(
            f"{phase[:-2]} {a:+.2f} + {b:.2f}/GB" for phase, (a, b) in fits.items()))
    return {phase: {"intercept_s": a, "s_per_gb": b} for phase, (a, b) in fits.items()}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {list(MODELS)}")
    parser.add_argument("--dtype", default="bfloat16", choices=sorted(PROBE_ATOL), help="staged files and server dtype")
    parser.add_argument("--learner-dtype", default="float32", choices=sorted(PROBE_ATOL),
                        help="the learner's params and probe compute (training keeps float32 master weights; "
                             "the export casts them on device)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=3)
    parser.add_argument("--step-prompts", type=int, default=4, help="prompts of the next step's generate (x 2)")
    parser.add_argument("--step-tokens", type=int, default=32, help="max tokens of the next step's generate")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.warmup < 0 or args.iters < 1:
        parser.error(f"--warmup {args.warmup} must be >= 0 and --iters {args.iters} >= 1")
    names = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in names if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; valid: {list(MODELS)}")

    results, skipped = [], []
    for name in names:
        outcome = bench_model(name, args.dtype, args.warmup, args.iters, args.learner_dtype, args.step_prompts,
                              args.step_tokens)
        (skipped if isinstance(outcome, str) else results).append(outcome)
        print("  " + (outcome if isinstance(outcome, str) else f"{name}: {dataclasses.asdict(outcome)}"), flush=True)
    fits = print_table(results, args.dtype, args.warmup, args.iters)
    out = {"dtype": args.dtype, "learner_dtype": args.learner_dtype, "results": [dataclasses.asdict(r) for r in results], "skipped": skipped,
           "fit": fits}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
