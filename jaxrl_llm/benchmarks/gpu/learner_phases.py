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
6 * D * V * completion tokens), and with `matmul_tflops` (the device's measured bf16 matmul
rate) the fraction of it.

`levers=True` then times the levers of the two big phases, each ALONE (one change from the
baseline at a time, `benchmarks.gpu.levers`):

  head_levers   the LM head with a larger chunk (HEAD_CHUNKS), bf16 logits out of the matmul
                feeding the float32 log-softmax (`logits_bf16`), float32 operands (`matmul_f32`);
  layer_levers  the layers with remat "dots" / "full" instead of "off", and with the attention
                paths other than the backend's default (cuDNN segment spans on NVIDIA GPUs):
                cuDNN with a dense mask, XLA's blocked attention; a path the backend lacks is
                recorded with the reason;

and `winner` names, per phase, the fastest lever and its speedup over the baseline
(baseline ms / lever ms; "baseline" when no lever beat it). A lever that fails is recorded
with its error. On CPU (`tiny=True`) the numbers mean nothing: the tests check the code path
and the FLOP split.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.benchmarks.common.model_shapes import model_config
from jaxrl_llm.benchmarks.gpu.levers import attention_unavailable, default_attention_path, lever_environment, switched
from jaxrl_llm.benchmarks.common.timing import median_seconds
from jaxrl_llm.benchmarks.common.rl_batch import TINY_MIX, LengthMix, rl_length_mix
from jaxrl_llm.models import chunked_logprobs_from_hidden, forward, init_params
from jaxrl_llm.models.logprobs import HeadOptions
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


HEAD_CHUNKS = (512, 1024, 2048, 4096)  # the default is HeadOptions().chunk_size = 128
TINY_HEAD_CHUNKS = (32,)


def head_levers(tiny: bool) -> dict[str, HeadOptions]:
    """name -> the head's options, each one change from the default (the first entry, "baseline")."""
    base = HeadOptions()
    levers = {"baseline": base}
    levers.update({f"chunk_{c}": base._replace(chunk_size=c) for c in (TINY_HEAD_CHUNKS if tiny else HEAD_CHUNKS)})
    levers["logits_bf16"] = base._replace(logits_dtype="compute")
    levers["matmul_f32"] = base._replace(matmul_dtype="float32")
    return levers


def layer_levers(head_dim: int) -> dict[str, tuple[str, str]]:
    """name -> (remat mode, attention path), each one change from the baseline ("off", the default path)."""
    path = default_attention_path(head_dim)
    levers = {"baseline": ("off", path), "remat_dots": ("dots", path), "remat_full": ("full", path)}
    levers.update({f"attention_{other}": ("off", other) for other in ("cudnn_segments", "cudnn_mask", "xla")
                   if other != path})
    return levers


class Setup(NamedTuple):
    """One packed micro-batch of the gpu-check mix and what its phases need."""

    cfg: Any  # the learner's compute config
    params: Any  # compute-dtype params
    tokens: jax.Array  # [R, W]
    segments: jax.Array
    positions: jax.Array
    head_slots: jax.Array  # [R * T_c]
    max_segments: int
    hidden_cotangent: jax.Array  # [R, W, D] bf16
    head_weights: jax.Array  # [1, R * T_c]


def layers_grad(setup: Setup, remat: str) -> Callable:
    """jit(grad) of the layers' output against the fixed cotangent, at one remat mode."""
    def hidden_of(p):
        return forward(p, setup.cfg, setup.tokens, positions=setup.positions, segment_ids=setup.segments,
                       return_hidden=True, remat=remat, max_segments=setup.max_segments)[0]
    return jax.jit(jax.grad(lambda p: jnp.sum(hidden_of(p).astype(jnp.float32) * setup.hidden_cotangent))), hidden_of


def head_loss(setup: Setup, p, hidden, options: HeadOptions | None = None):
    rows, width = setup.tokens.shape
    predicting = jnp.take(hidden.reshape(rows * width, -1), setup.head_slots, axis=0)[None]
    targets = jnp.take(setup.tokens.reshape(-1), setup.head_slots + 1)[None]
    logp = chunked_logprobs_from_hidden(predicting, targets, p, setup.cfg, options=options)
    return jnp.sum(logp * setup.head_weights)


def timed(fn: Callable, repeats: int, work: float | None, matmul_tflops: float | None) -> dict[str, Any]:
    """Median ms of fn (after a warm-up call, the compile) and, with work, TFLOP/s and its share of matmul_tflops."""
    ms = 1e3 * median_seconds(lambda: jax.block_until_ready(fn()), repeats)
    tflops = None if work is None else work / ms / 1e9
    return {"ms": ms, "flops": work, "tflops": tflops,
            "fraction_of_matmul": None if tflops is None or not matmul_tflops else tflops / matmul_tflops}


def winner(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The fastest measured entry and baseline ms / its ms."""
    measured = {name: r["ms"] for name, r in results.items() if "ms" in r}
    if "baseline" not in measured:
        return {"lever": None, "reason": "the baseline did not run"}
    best = min(measured, key=measured.get)
    return {"lever": best, "ms": measured[best], "baseline_ms": measured["baseline"],
            "speedup_vs_baseline": measured["baseline"] / measured[best],
            "fraction_of_matmul": results[best].get("fraction_of_matmul")}


def _lever(name: str, run: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        result = run()
    except Exception as error:  # noqa: BLE001 -- a lever that fails is a result; the others still run
        result = {"error": f"{type(error).__name__}: {error}"[:1500]}
    print(f"[learner_phases]   {name}: " + (f"{result['ms']:.2f} ms" if "ms" in result else
                                            result.get("error") or result.get("skipped", "")), flush=True)
    return result


def measure_levers(setup: Setup, params, hidden, flops: dict[str, float], *, tiny: bool, repeats: int,
                   matmul_tflops: float | None) -> dict[str, Any]:
    """head_levers and layer_levers, each alone, and the winner of each phase."""
    heads: dict[str, Any] = {}
    for name, options in head_levers(tiny).items():
        def run(options=options):
            grad = jax.jit(jax.grad(lambda p, h: head_loss(setup, p, h, options), argnums=(0, 1)))
            return {**options._asdict(), **timed(lambda: grad(params, hidden), repeats, flops["head"], matmul_tflops)}
        heads[name] = _lever(f"head {name}", run)
    layers: dict[str, Any] = {}
    for name, (remat, path) in layer_levers(setup.cfg.head_dim).items():
        missing = attention_unavailable(path, setup.cfg.head_dim)
        if missing:
            layers[name] = {"remat": remat, "attention": path, "skipped": missing}
            continue

        def run(remat=remat, path=path):
            with switched(lever_environment(attention=path)):
                grad = layers_grad(setup, remat)[0]
                return {"remat": remat, "attention": path,
                        **timed(lambda: grad(params), repeats, flops["layers"], matmul_tflops)}
        layers[name] = _lever(f"layers {name}", run)
    return {"head_levers": heads, "layer_levers": layers, "winner": {"head": winner(heads), "layers": winner(layers)}}


def learner_phases(model: str = "qwen2.5-1.5b", tokens_per_step: int = 65536, *, micro_batch_tokens: int = 8192,
                   tiny: bool = False, repeats: int = 5, levers: bool = False,
                   matmul_tflops: float | None = None) -> dict[str, Any]:
    mix = TINY_MIX if tiny else LengthMix()
    if tiny:
        model, tokens_per_step, micro_batch_tokens = "tiny", 256, 2 * (mix.prompt_width + mix.completion_width)
    cfg = model_config(model, mix.prompt_width + mix.completion_width)
    seq, _ = rl_length_mix(tokens_per_step, mix, cfg.vocab_size)
    train_cfg = dataclasses.replace(TrainConfig(), precision="bf16", pack=True, micro_batch_tokens=micro_batch_tokens,
                                    remat="off")
    learner = Learner(cfg, core.get_recipe("grpo"), train_cfg, total_steps=2)
    plan = learner.plan(seq)
    master = init_params(cfg, jax.random.key(0), dtype="float32")
    params = learner.compute_params(master)
    tokens, segments, positions = (jnp.asarray(x[0]) for x in (plan.tokens, plan.segment_ids, plan.positions))
    head_slots = jnp.asarray(plan.head_slots[0])
    members = np.flatnonzero(plan.micro_batch == 0)
    completion_tokens = int(seq.completion_mask[members].sum())
    lengths = seq.attention_mask[members].sum(1)
    rows, width = tokens.shape
    keys = jax.random.split(jax.random.key(1), 3)
    setup = Setup(learner.compute_cfg, params, tokens, segments, positions, head_slots, plan.max_segments,
                  jax.random.normal(keys[0], (rows, width, cfg.hidden_size), jnp.float32).astype(jnp.bfloat16),
                  jax.random.normal(keys[1], (1, head_slots.shape[0]), jnp.float32))
    layers, hidden_of = layers_grad(setup, learner.remat)
    hidden = jax.jit(hidden_of)(params)
    head = jax.jit(jax.grad(lambda p, h: head_loss(setup, p, h), argnums=(0, 1)))
    micro = jax.jit(jax.grad(lambda p: head_loss(setup, p, hidden_of(p))))
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
                           "micro_batches_run": int(plan.used.sum()), "remat": learner.remat,
                           "attention": default_attention_path(cfg.head_dim), "matmul_tflops": matmul_tflops,
                           "phases": {}}
    timings = {"layers": lambda: layers(params), "head": lambda: head(params, hidden),
               "micro_step": lambda: micro(params), "optimizer": lambda: optimizer_step(master, opt_state, grads)}
    phase_work = {"layers": flops["layers"], "head": flops["head"], "micro_step": flops["layers"] + flops["head"],
                  "optimizer": None}
    for name, fn in timings.items():
        out["phases"][name] = result = timed(fn, repeats, phase_work[name], matmul_tflops)
        print(f"[learner_phases] {name}: {result['ms']:.2f} ms"
              + ("" if result["tflops"] is None else f", {result['tflops']:.1f} TFLOP/s"), flush=True)
    if levers:
        out.update(measure_levers(setup, params, hidden, flops, tiny=tiny, repeats=repeats,
                                  matmul_tflops=matmul_tflops))
    return out
