"""A small decoder trained from scratch on 1-digit addition, the start of the RL run that
`make gpu-check` times on a device (`benchmarks.gpu.gpu_rl.rl_end_to_end`).

SmolLM2's weights cannot travel to the device machine, so the policy is a small random decoder
over SmolLM2's tokenizer trained by supervised learning on the TRAIN questions -> answers,
prompts rendered as the loop renders them (`train.policy.encode_prompts`), for a fixed number of
steps, with half of the targets written with a minus sign ("-8", graded wrong): a format error on
every question that RL can remove on the held-out questions too (a from-scratch decoder this
small memorises its RL gains on the train questions otherwise). Saved as an HF directory
(`bridge.save_hf_dir`, the tokenizer files copied from `tokenizer_dir`).
"""
from __future__ import annotations

import dataclasses
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.benchmarks.common.timing import log

# ------------------------------------------------------------------ settings
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
    # Mixture of experts (0 = dense): experts per layer and per token (Qwen3-MoE family, renormalised
    # top-k gates, each expert ``hidden`` wide: the k = 2 active experts match the dense MLP's width)
    num_experts: int = 0
    experts_per_token: int = 0


E2E_TINY = E2ESetting()
E2E_FULL = dataclasses.replace(E2ESetting(), prompts_per_step=16, samples_per_prompt=16, eval_samples=64)


def policy_from_scratch(tokenizer_dir: str, init_dir: str, hidden: int, layers: int, seed: int, *,
                        num_experts: int = 0, experts_per_token: int = 0):
    """A random decoder over `tokenizer_dir`'s vocabulary, saved at `init_dir` with the tokenizer
    files and loaded back as the loop loads a policy (`train.policy.load_policy`). With
    ``num_experts`` > 0 a Qwen3-MoE (every MLP ``num_experts`` experts of width ``hidden``, top
    ``experts_per_token``, renormalised gates)."""
    from tokenizers import Tokenizer

    from jaxrl_llm import bridge
    from jaxrl_llm.models import DecoderConfig, init_params
    from jaxrl_llm.train.policy import load_policy

    vocab = Tokenizer.from_file(os.path.join(tokenizer_dir, "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    if hidden % 16:
        raise ValueError(f"hidden {hidden} must be a multiple of 16 (4 heads of hidden / 4)")
    moe = dict(family="qwen3_moe", num_experts=num_experts, num_experts_per_tok=experts_per_token,
               moe_intermediate_size=hidden, norm_topk_prob=True) if num_experts else {}
    cfg = DecoderConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_layers=layers,
                        num_heads=4, num_kv_heads=2, head_dim=hidden // 4, tie_word_embeddings=True,
                        rms_norm_eps=1e-5, max_position_embeddings=256, **moe)
    params = init_params(cfg, jax.random.key(seed), dtype="float32")
    return load_policy(bridge.save_hf_dir(cfg, jax.device_get(params), init_dir, tokenizer_dir=tokenizer_dir))


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

    policy = policy_from_scratch(tokenizer_dir, f"{out_dir}_init", setting.hidden, setting.layers, seed,
                                 num_experts=setting.num_experts, experts_per_token=setting.experts_per_token)
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
    log(f"SFT from scratch: hidden {setting.hidden}, {setting.layers} layers, vocab {cfg.vocab_size}, "
         f"{len(examples)} train questions (minus-sign form with p = {setting.minus_fraction}), "
         f"{setting.sft_steps} full-batch steps at lr {setting.sft_lr}")
    t0 = time.perf_counter()
    losses = []
    with jax.default_matmul_precision("highest"):
        for s in range(1, setting.sft_steps + 1):
            minus = rng.random(len(examples)) < setting.minus_fraction
            rows = {k: jnp.asarray(np.where(minus.reshape(-1, *([1] * (v.ndim - 1))), forms[1][k], v))
                    for k, v in forms[0].items()}
            params, opt_state, loss = step(params, opt_state, rows)
            if s in save_at:
                bridge.save_hf_dir(cfg, jax.device_get(params), f"{out_dir}_step{s}", tokenizer_dir=tokenizer_dir)
            if s % 20 == 0 or s == setting.sft_steps:
                losses.append((s, float(loss)))
                log(f"  SFT step {s}: loss {float(loss):.3f} ({time.perf_counter() - t0:.1f} s)")
    sft_s = time.perf_counter() - t0
    model_dir = bridge.save_hf_dir(cfg, jax.device_get(params), out_dir, tokenizer_dir=tokenizer_dir)
    return {"model_dir": model_dir, "sft_s": sft_s, "sft_losses": losses, "train_questions": len(examples),
            "vocab_size": int(cfg.vocab_size), "minus_fraction": setting.minus_fraction}

