"""Where one learner micro-batch's time goes on a device: the decoder layers, the LM head with its
log-softmax, and the optimiser, each jitted alone on the same packed rows as `Learner.update`.

`learner_phases(model, tokens_per_step, micro_batch_tokens)` builds the gpu-check RL length mix
(`rl_batch.rl_length_mix`), packs it as the learner does (`Learner.plan`), and times on the first
micro-batch (R rows x W slots, bf16 compute, float32 master weights):

  layers      forward + backward of the decoder layers (`models.forward(return_hidden=True)`,
              the learner's remat and cuDNN attention), against a fixed random cotangent;
  head        forward + backward of the LM head and log-softmax on the R x T_c gathered
              completion positions (`models.chunked_logprobs_from_hidden`, the fused VJP);
  micro_step  the learner's whole micro-batch gradient (`Learner.loss_and_grads` on one
              micro-batch's worth of sequences is not exposed, so: layers + head in one jit);
  optimizer   global-norm clipping + AdamW on the float32 master weights (`make_optimizer`).

Each phase reports median milliseconds and, where it does matmul work, its model FLOPs and
TFLOP/s by the gpu-check count (layers: 6 * N_body * tokens + the attention term; head:
6 * D * V * completion tokens). On CPU (`tiny=True`) the numbers mean nothing: the tests check
the code path and the FLOP split.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.benchmarks.learner_gpu import model_config
from jaxrl_llm.benchmarks.timing import median_seconds
from jaxrl_llm.benchmarks.rl_batch import TINY_MIX, LengthMix, rl_length_mix
from jaxrl_llm.models import chunked_logprobs_from_hidden, forward, init_params
from jaxrl_llm.train.config import TrainConfig
from jaxrl_llm.train.learn.learner import Learner
from jaxrl_llm.train.learn.optimizer import make_optimizer


def phase_flops(cfg, segment_lengths: np.ndarray, completion_tokens: int) -> dict[str, float]:
    """Model FLOPs of one micro-batch's fwd+bwd: the layers on its tokens (with attention over
    each sequence's causal context) and the head on its completion tokens."""
    d, hd = cfg.hidden_size, cfg.head_dim
    body = cfg.num_layers * (d * hd * (cfg.num_heads + 2 * cfg.num_kv_heads) + cfg.num_heads * hd * d
                             + 3 * d * cfg.intermediate_size)
    lengths = np.asarray(segment_lengths, np.float64)
    attention = 12.0 * cfg.num_layers * cfg.num_heads * hd * float((lengths * (lengths + 1) / 2).sum())
    return {"layers": 6.0 * body * float(lengths.sum()) + attention,
            "head": 6.0 * d * cfg.vocab_size * float(completion_tokens)}


def learner_phases(model: str = "qwen2.5-1.5b", tokens_per_step: int = 65536, *, micro_batch_tokens: int = 8192,
                   tiny: bool = False, repeats: int = 5) -> dict[str, Any]:
    mix = TINY_MIX if tiny else LengthMix()
    if tiny:
        model, tokens_per_step, micro_batch_tokens = "tiny", 256, 2 * (mix.prompt_width + mix.completion_width)
    cfg = model_config(model, mix.prompt_width + mix.completion_width)
    seq, _ = rl_length_mix(tokens_per_step, mix, cfg.vocab_size)
    train_cfg = dataclasses.replace(TrainConfig(), precision="bf16", pack=True, micro_batch_tokens=micro_batch_tokens,
                                    remat="off")
    learner = Learner(cfg, core.get_recipe("grpo"), train_cfg, total_steps=2)
    plan = learner.plan(seq)
    compute_cfg = learner.compute_cfg
    master = init_params(cfg, jax.random.key(0), dtype="float32")
    params = learner.compute_params(master)
    tokens, segments, positions = (jnp.asarray(x[0]) for x in (plan.tokens, plan.segment_ids, plan.positions))
    head_slots = jnp.asarray(plan.head_slots[0])
    members = np.flatnonzero(plan.micro_batch == 0)
    completion_tokens = int(seq.completion_mask[members].sum())
    lengths = seq.attention_mask[members].sum(1)
    rows, width = tokens.shape
    keys = jax.random.split(jax.random.key(1), 3)
    hidden_cotangent = jax.random.normal(keys[0], (rows, width, cfg.hidden_size), jnp.float32).astype(jnp.bfloat16)
    head_weights = jax.random.normal(keys[1], (1, head_slots.shape[0]), jnp.float32)

    def hidden_of(p):
        return forward(p, compute_cfg, tokens, positions=positions, segment_ids=segments, return_hidden=True,
                       remat=learner.remat, max_segments=plan.max_segments)[0]

    def head_loss(p, hidden):
        predicting = jnp.take(hidden.reshape(rows * width, -1), head_slots, axis=0)[None]
        targets = jnp.take(tokens.reshape(-1), head_slots + 1)[None]
        return jnp.sum(chunked_logprobs_from_hidden(predicting, targets, p, compute_cfg) * head_weights)

    layers = jax.jit(jax.grad(lambda p: jnp.sum(hidden_of(p).astype(jnp.float32) * hidden_cotangent)))
    hidden = jax.jit(hidden_of)(params)
    head = jax.jit(jax.grad(head_loss, argnums=(0, 1)))
    micro = jax.jit(jax.grad(lambda p: head_loss(p, hidden_of(p))))
    optimizer = make_optimizer(train_cfg, 10)
    opt_state = optimizer.init(master)
    grads = jax.tree.map(lambda x: jnp.full_like(x, 1e-3), master)

    @jax.jit
    def optimizer_step(master, opt_state, grads):
        updates, opt_state = optimizer.update(grads, opt_state, master)
        return jax.tree.map(jnp.add, master, updates), opt_state

    flops = phase_flops(cfg, lengths, completion_tokens)
    out: dict[str, Any] = {"model": model, "rows": int(rows), "row_width": int(width), "sequences": int(members.size),
                           "tokens": int(lengths.sum()), "completion_tokens": completion_tokens,
                           "micro_batches_run": int(plan.used.sum()), "remat": learner.remat, "phases": {}}
    timings = {"layers": lambda: layers(params), "head": lambda: head(params, hidden),
               "micro_step": lambda: micro(params), "optimizer": lambda: optimizer_step(master, opt_state, grads)}
    phase_work = {"layers": flops["layers"], "head": flops["head"], "micro_step": flops["layers"] + flops["head"],
                  "optimizer": None}
    for name, fn in timings.items():
        ms = 1e3 * median_seconds(lambda fn=fn: jax.block_until_ready(fn()), repeats)
        work = phase_work[name]
        out["phases"][name] = {"ms": ms, "flops": work, "tflops": None if work is None else work / ms / 1e9}
        print(f"[learner_phases] {name}: {ms:.2f} ms" + ("" if work is None else f", {work / ms / 1e9:.1f} TFLOP/s"),
              flush=True)
    return out
