"""Learner step throughput and MFU for Qwen2.5-0.5B / 1.5B shaped models (random weights).

    python -m jaxrl_llm.benchmarks.gpu.learner_gpu [--models qwen2.5-0.5b,qwen2.5-1.5b] [--dtypes bf16,fp16]
        [--batch 16] [--seq-len 2048] [--steps 5] [--peak-tflops 989] [--json out.json]
    python -m jaxrl_llm.benchmarks.gpu.learner_gpu --tiny      # CPU: shapes and correctness only

Per (model, dtype) on one RL-like batch (rows = prompt + completion, lengths drawn from
[seq_len/4, seq_len], the same sequences in every variant) it times:

  learner      `Learner.update` (the real step: micro-batches, fp32 master weights, AdamW,
               fp16 loss scaling), rows padded to seq_len;
  padded       a jitted fwd+bwd+AdamW step of loss = -sum_t log pi(y_t) through
               `models.token_logprobs(attention_mask=...)`, rows padded to seq_len;
  packed       the same step on the same sequences packed first-fit-decreasing into rows
               of seq_len, `segment_ids` separating them (attention never crosses one).

and, in the same run, a matmul ceiling: the FLOP/s of a square [n, n] @ [n, n] matmul in
the dtype. Reported: useful (non-padding) tokens/s, achieved model TFLOP/s, and MFU =
achieved / peak, with peak = --peak-tflops (the datasheet number, e.g. 989 for H100 SXM
bf16 dense) and also relative to the measured matmul ceiling.

Model FLOPs per trained token (Kaplan et al. 2020, "Scaling laws"; Chowdhery et al. 2022,
PaLM, appendix B): 6 * N_matmul + 12 * n_layers * n_heads * head_dim * c, where N_matmul
counts the weights of every matmul (LM head included, embeddings lookup excluded) and c is
the mean causal context of a token (len + 1) / 2 of its sequence; recomputation (remat,
chunked LM head) is not counted, as MFU requires.

No GPU here: `--tiny` runs a 2-layer model of the same family on CPU so the code path and
the packed == padded loss check are exercised; its tokens/s mean nothing for GPUs.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxrl_llm import core
from jaxrl_llm.benchmarks.common.model_shapes import model_config
from jaxrl_llm.benchmarks.common.timing import median_seconds
from jaxrl_llm.models import DecoderConfig, init_params, token_logprobs
from jaxrl_llm.train.learn.batch import SequenceBatch
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner

DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Datasheet dense bf16/fp16 peaks (TFLOP/s, no sparsity) by a piece of jax's device_kind; the
# default of --peak-tflops. Unknown devices report MFU only against the measured matmul ceiling.
PEAK_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0,
               "TPU v4": 275.0, "TPU v5 lite": 197.0, "TPU v5p": 459.0, "TPU v6 lite": 918.0}


def datasheet_peak(device_kind: str, dtype_name: str) -> float | None:
    """The PEAK_TFLOPS entry of the first key found in device_kind, for bf16/fp16 only."""
    if dtype_name not in ("bf16", "fp16"):
        return None
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in device_kind), None)


def matmul_params(cfg: DecoderConfig) -> int:
    """Weights that take part in a matmul per token: q, k, v, o, gate, up, down per layer + LM head."""
    d, hd = cfg.hidden_size, cfg.head_dim
    attn = d * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * hd * d
    mlp = 3 * d * cfg.intermediate_size
    return cfg.num_layers * (attn + mlp) + d * cfg.vocab_size


def train_flops(cfg: DecoderConfig, lengths: np.ndarray) -> float:
    """Model FLOPs of one fwd+bwd over sequences of these lengths (see module docstring)."""
    lengths = np.asarray(lengths, np.float64)
    tokens = lengths.sum()
    context_sum = (lengths * (lengths + 1) / 2).sum()  # sum over tokens of their causal context
    return 6.0 * matmul_params(cfg) * tokens + 12.0 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context_sum


# -------------------------------------------------------------------- batches
def sample_lengths(batch: int, seq_len: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(max(seq_len // 4, 2), seq_len + 1, size=batch)


def padded_batch(lengths: np.ndarray, seq_len: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Right-padded rows: tokens, attention_mask, loss mask over next-token targets [B, T-1]."""
    rng = np.random.default_rng(seed + 1)
    tokens = np.zeros((len(lengths), seq_len), np.int32)
    mask = np.zeros((len(lengths), seq_len), np.int32)
    for i, n in enumerate(lengths):
        tokens[i, :n] = rng.integers(1, vocab, size=n)
        mask[i, :n] = 1
    return {"tokens": tokens, "attention_mask": mask, "loss_mask": (mask[:, 1:] * mask[:, :-1]).astype(np.float32)}


def pack(padded: dict[str, np.ndarray], seq_len: int) -> dict[str, np.ndarray]:
    """First-fit decreasing into rows of seq_len; segment ids 1, 2, ... per row, 0 = padding."""
    lengths = padded["attention_mask"].sum(1)
    rows: list[list[int]] = []
    free: list[int] = []
    for i in np.argsort(-lengths, kind="stable"):
        slot = next((r for r, room in enumerate(free) if room >= lengths[i]), None)
        if slot is None:
            rows.append([]), free.append(seq_len)
            slot = len(rows) - 1
        rows[slot].append(int(i))
        free[slot] -= int(lengths[i])
    tokens = np.zeros((len(rows), seq_len), np.int32)
    segments = np.zeros((len(rows), seq_len), np.int32)
    for r, members in enumerate(rows):
        at = 0
        for s, i in enumerate(members, start=1):
            n = int(lengths[i])
            tokens[r, at:at + n] = padded["tokens"][i, :n]
            segments[r, at:at + n] = s
            at += n
    same = (segments[:, 1:] == segments[:, :-1]) & (segments[:, 1:] > 0)
    return {"tokens": tokens, "segment_ids": segments, "loss_mask": same.astype(np.float32)}


# ---------------------------------------------------------------------- steps
def make_step(cfg: DecoderConfig, dtype: str, packed: bool, lr: float = 1e-5, remat: bool = True):
    """jit(fwd+bwd+AdamW) of loss = -sum_t mask_t log pi(y_t): fp32 master params, forward
    in `dtype`, each layer recomputed in the backward pass when `remat` (without it XLA keeps
    every layer's [B, H, T, T] float32 attention scores: 180 GB at 16 x 2048 for the 0.5B shape).
    Returns (step(params, opt_state, batch) -> (params, opt_state, loss), optimizer)."""
    compute_cfg = cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype)
    optimizer = optax.adamw(lr)

    def loss_fn(params, batch):
        cast = jax.tree.map(lambda x: x.astype(dtype), params)
        layout = {"segment_ids": batch["segment_ids"]} if packed else {"attention_mask": batch["attention_mask"]}
        logp = token_logprobs(cast, compute_cfg, batch["tokens"], remat=remat, **layout)
        return -jnp.sum(logp * batch["loss_mask"])

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, optimizer


def learner_inputs(padded: dict[str, np.ndarray], seq_len: int, prompt_width: int):
    """The padded rows as a Learner SequenceBatch + StepBatch (grpo, random rewards, pi_old = mu = -2)."""
    tokens, mask = padded["tokens"], padded["attention_mask"]
    rows = tokens.shape[0]
    positions = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
    completion = mask[:, prompt_width:].astype(np.float32)
    seq = SequenceBatch(tokens, mask, positions, completion, -2.0 * completion, np.zeros(rows, bool), prompt_width)
    rewards = np.random.default_rng(3).integers(0, 2, size=(rows // 2, 2)).astype(np.float32)
    recipe = core.get_recipe("grpo")
    batch, _ = core.prepare_step_batch(recipe, core.StepInputs(jnp.asarray(rewards), jnp.asarray(completion),
                                                               jnp.asarray(-2.0 * completion)))
    return recipe, seq, batch


def matmul_ceiling(dtype: str, n: int, steps: int) -> float:
    """FLOP/s of a square matmul in `dtype` (the best this device does on dense math)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    matmul = jax.jit(lambda x, y: x @ y)
    return 2.0 * n ** 3 / median_seconds(lambda: matmul(a, b).block_until_ready(), steps)


def run(model: str, dtype_name: str, *, batch: int, seq_len: int, steps: int, peak_tflops: float | None,
        matmul_n: int, micro_batch: int, remat: bool = True) -> list[dict[str, Any]]:
    dtype = DTYPES[dtype_name]
    cfg = model_config(model, seq_len)
    params = jax.tree.map(lambda x: x.astype(jnp.float32), init_params(cfg, jax.random.key(0), dtype="float32"))
    lengths = sample_lengths(batch, seq_len)
    padded = padded_batch(lengths, seq_len, cfg.vocab_size)
    packed = pack(padded, seq_len)
    flops = train_flops(cfg, lengths)
    ceiling = matmul_ceiling(dtype, matmul_n, steps)
    rows = []

    def record(variant: str, seconds: float, batch_rows: int, loss: float | None):
        achieved = flops / seconds
        rows.append({"model": model, "dtype": dtype_name, "variant": variant, "rows": batch_rows,
                     "useful_tokens": int(lengths.sum()), "seconds": seconds,
                     "tokens_per_s": float(lengths.sum() / seconds), "model_tflops": achieved / 1e12,
                     "matmul_ceiling_tflops": ceiling / 1e12, "fraction_of_matmul_ceiling": achieved / ceiling,
                     "mfu": None if peak_tflops is None else achieved / (peak_tflops * 1e12), "loss": loss})

    for variant, data, packed_layout in (("padded", padded, False), ("packed", packed, True)):
        step, optimizer = make_step(cfg, dtype, packed_layout, remat=remat)
        state = {"params": params, "opt": optimizer.init(params)}
        device_batch = {k: jnp.asarray(v) for k, v in data.items()}
        loss = float(step(params, state["opt"], device_batch)[2])  # loss at the initial params

        def one(step=step, state=state, device_batch=device_batch):
            state["params"], state["opt"], value = step(state["params"], state["opt"], device_batch)
            value.block_until_ready()

        record(variant, median_seconds(one, steps), data["tokens"].shape[0], loss)

    prompt_width = max(1, seq_len // 8)
    train_cfg = dataclasses.replace(TrainConfig(), precision=dtype_name, micro_batch_size=micro_batch, lr=1e-5,
                                    remat="full" if remat else "off")
    recipe, seq, step_batch = learner_inputs(padded, seq_len, prompt_width)
    learner = Learner(cfg, recipe, train_cfg, total_steps=steps + 2)
    holder = {"state": learner.init(params)}

    def learner_step():
        holder["state"], metrics = learner.update(holder["state"], seq, step_batch)
        jax.block_until_ready(metrics)

    record("learner", median_seconds(learner_step, steps), batch, None)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="qwen2.5-0.5b,qwen2.5-1.5b")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--matmul-n", type=int, default=8192)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="datasheet dense peak of the dtype (default: PEAK_TFLOPS by device kind)")
    parser.add_argument("--no-remat", dest="remat", action="store_false",
                        help="keep every layer's activations (default: recompute each layer in the backward pass)")
    parser.add_argument("--tiny", action="store_true", help="CPU-sized model and batch (shapes/correctness only)")
    parser.add_argument("--json", default=None, help="write the rows here")
    args = parser.parse_args(argv)
    if args.tiny:
        args.models, args.batch, args.seq_len, args.micro_batch, args.matmul_n = "tiny", 4, 64, 2, 256
        args.steps = min(args.steps, 2)
    for name in args.dtypes.split(","):
        if name not in DTYPES:
            raise SystemExit(f"--dtypes entry {name!r} is unknown; valid: {', '.join(DTYPES)}")
    if args.batch % args.micro_batch or args.batch % 2:
        raise SystemExit(f"--batch={args.batch} must be even and a multiple of --micro-batch={args.micro_batch}")
    rows = []
    print(f"devices: {jax.devices()}")
    for model in args.models.split(","):
        for dtype_name in args.dtypes.split(","):
            for row in run(model, dtype_name, batch=args.batch, seq_len=args.seq_len, steps=args.steps,
                           peak_tflops=args.peak_tflops or datasheet_peak(jax.devices()[0].device_kind, dtype_name),
                           matmul_n=args.matmul_n, micro_batch=args.micro_batch, remat=args.remat):
                rows.append(row)
                mfu = "" if row["mfu"] is None else f"  MFU {row['mfu']:.1%}"
                print(f"{row['model']:>13} {row['dtype']} {row['variant']:>7}: {row['rows']:3d} rows, "
                      f"{row['tokens_per_s']:12.1f} useful tok/s, {row['model_tflops']:8.3f} TFLOP/s = "
                      f"{row['fraction_of_matmul_ceiling']:.1%} of the {row['matmul_ceiling_tflops']:.3f} TFLOP/s "
                      f"matmul ceiling{mfu}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": str(jax.devices()[0].device_kind), "args": vars(args), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
