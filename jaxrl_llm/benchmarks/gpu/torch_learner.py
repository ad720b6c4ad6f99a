"""The PyTorch reference of the gpu-check learner rows: the same step on the same batch in torch.

    python -m jaxrl_llm.benchmarks.gpu.torch_learner --model qwen2.5-1.5b --tokens 16384 [--tiny] --json OUT

One optimiser step = what `Learner.update` does with one sequence per row: fp32 master weights,
the forward and backward in bf16 (`torch.autocast`, bf16 matmuls as on the JAX side), the LM head
and a float32 log-softmax on the completion slots only, loss = -sum_t w_t log pi(y_t) with fixed
per-token weights (the policy-gradient loss at pi = pi_old), micro-batches of R rows with the
gradients summed, then AdamW (torch's fused kernel on CUDA). The batch is
`rl_batch.rl_length_mix` (same seed, same tokens), rows left-padded prompts + right-padded
completions with positions counting real tokens, attention through transformers' "sdpa" (fused
kernels on CUDA). Timed eagerly and under `torch.compile` (default mode), medians after warm-up
steps; float32 matmuls at full precision (TF32 off), so nothing runs in a lower precision than
JAX's side does.

Mode "packed" (eager): the same sequences packed as the JAX learner packs them (`train.learn.packing`,
first-fit decreasing, R rows of W slots), fed to transformers' packed-sequence path: no attention
mask, position_ids restarting at 0 in every sequence. With flash-attn installed (CUDA) that is its
varlen kernel (attn_implementation="flash_attention_2"); without it transformers (>= 4.53) turns the
position_ids into a block-diagonal causal mask for "sdpa" (a dense mask, no varlen kernel), and the
run says so in its `attention` field. `gpu_check` runs it in a process of its own before JAX takes the GPU (JAX
preallocates the device's memory), with JAX_PLATFORMS=cpu (the batch is built with its code).
"""
from __future__ import annotations

import argparse
import json
import time
from typing import Any

import numpy as np

from jaxrl_llm.benchmarks.common.timing import interleaved_times


def qwen2_config(shape: dict[str, Any], max_positions: int):
    """transformers' Qwen2Config of a `common.model_shapes.MODELS` entry (tied head, qkv bias, theta 1e6)."""
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=shape["vocab_size"], hidden_size=shape["hidden_size"],
                       intermediate_size=shape["intermediate_size"], num_hidden_layers=shape["num_layers"],
                       num_attention_heads=shape["num_heads"], num_key_value_heads=shape["num_kv_heads"],
                       head_dim=shape["head_dim"], tie_word_embeddings=True, rope_theta=1_000_000.0,
                       max_position_embeddings=max_positions, attn_implementation="sdpa")


def packed_micro_batches(seq, weights: np.ndarray, rows_per_micro: int) -> list[dict[str, np.ndarray]]:
    """The JAX learner's packed micro-batches (`packing.plan_rows`): ids and positions [R, W], and per
    head slot (R * T_c, the slots predicting completion tokens) its flat slot, target and weight."""
    from jaxrl_llm.train.learn.packing import plan_rows

    plan = plan_rows(seq.tokens, seq.attention_mask, seq.prompt_width, rows_per_micro=rows_per_micro, pack=True)
    out = []
    for m in np.flatnonzero(plan.used):
        w = np.zeros(plan.head_slots.shape[1], np.float32)
        for n in np.flatnonzero(plan.micro_batch == m):
            real = seq.completion_mask[n] > 0
            w[plan.completion_index[n][real]] = weights[n][real]
        flat = plan.tokens[m].reshape(-1)
        out.append({"ids": plan.tokens[m], "positions": plan.positions[m], "slots": plan.head_slots[m],
                    "targets": flat[plan.head_slots[m] + 1], "w": w})
    return out


def packed_attention(device: str) -> tuple[str, str]:
    """(attn_implementation, what it means) for transformers' packed-sequence path on `device`."""
    from transformers.utils import is_flash_attn_2_available

    if device == "cuda" and is_flash_attn_2_available():
        return "flash_attention_2", "flash-attn varlen kernel (position_ids restart per sequence)"
    why = "flash_attn is not importable" if device == "cuda" else "no CUDA device"
    return "sdpa", (f"sdpa with transformers' block-diagonal causal mask from position_ids; the varlen kernel "
                    f"not run: {why}")


def torch_step_rate(shape: dict[str, Any], tokens: np.ndarray, attention: np.ndarray, weights: np.ndarray,
                    prompt_width: int, *, rows_per_micro: int, compiled: bool, steps: int, warmup: int,
                    device: str, packed: list[dict[str, np.ndarray]] | None = None) -> dict[str, Any]:
    """Median seconds of one optimiser step (module docstring) over `steps`, after `warmup`;
    `packed` (`packed_micro_batches`): the packed layout instead of one sequence per row."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    config = qwen2_config(shape, tokens.shape[1] + 8)
    attention_note = "sdpa, one sequence per row (padding masked)"
    if packed is not None:
        config._attn_implementation, attention_note = packed_attention(device)
    with torch.device(device):  # initialised on the device: a 1.5B init on the host takes minutes
        model = Qwen2ForCausalLM(config).float().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=device == "cuda")
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    mask = torch.tensor(attention, dtype=torch.long, device=device)
    positions = torch.clamp(mask.cumsum(1) - 1, min=0)
    w = torch.tensor(weights, dtype=torch.float32, device=device)
    completion = w.shape[1]

    def micro_loss(ids, mask, positions, w):
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            hidden = model.model(input_ids=ids, attention_mask=mask, position_ids=positions).last_hidden_state
            predicting = hidden[:, prompt_width - 1:prompt_width - 1 + completion]
            logits = model.lm_head(predicting)
        logp = torch.log_softmax(logits.float(), dim=-1)
        targets = ids[:, prompt_width:prompt_width + completion]
        return -(logp.gather(-1, targets[..., None])[..., 0] * w).sum()

    def packed_loss(batch):
        ids = torch.tensor(batch["ids"], dtype=torch.long, device=device)
        positions = torch.tensor(batch["positions"], dtype=torch.long, device=device)
        slots = torch.tensor(batch["slots"], dtype=torch.long, device=device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            hidden = model.model(input_ids=ids, position_ids=positions, use_cache=False).last_hidden_state
            logits = model.lm_head(hidden.reshape(-1, hidden.shape[-1])[slots])
        logp = torch.log_softmax(logits.float(), dim=-1)
        targets = torch.tensor(batch["targets"], dtype=torch.long, device=device)
        w_packed = torch.tensor(batch["w"], dtype=torch.float32, device=device)
        return -(logp.gather(-1, targets[:, None])[:, 0] * w_packed).sum()

    # Static shapes: a last, smaller micro-batch gets a graph of its own. (With the row slice as
    # an argument, torch 2.x recompiled it with symbolic sizes and inductor's backward failed on
    # the H100: "shape '[512, 1536]' is invalid for input of size 0".)
    forward_backward = torch.compile(micro_loss, dynamic=False) if compiled else micro_loss

    def step() -> float:
        optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for batch in packed or []:
            loss = packed_loss(batch)
            loss.backward()
            total += float(loss.detach())
        for start in range(0, ids.shape[0] if packed is None else 0, rows_per_micro):
            rows = slice(start, start + rows_per_micro)
            loss = forward_backward(ids[rows], mask[rows], positions[rows], w[rows])
            loss.backward()
            total += float(loss.detach())
        optimizer.step()
        if device == "cuda":
            torch.cuda.synchronize()
        return total

    t0 = time.perf_counter()
    first_loss = step()  # at the initial weights: the same in every mode (same seed, same batch)
    for _ in range(warmup - 1):
        step()
    warmup_s = time.perf_counter() - t0
    times = interleaved_times({"step": step}, 0, steps)["step"]
    mode = "torch.compile" if compiled else "eager"
    return {"mode": mode if packed is None else f"packed {mode}", "layout": "one per row" if packed is None
            else "packed", "attention": attention_note, "seconds": float(np.median(times)), "first_loss": first_loss,
            "seconds_all": times, "warmup_s": warmup_s, "torch": torch.__version__, "device": device,
            "matmul_precision": "bf16 autocast; float32 matmuls full precision (TF32 off)",
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2 ** 30 if device == "cuda" else None}


def main(argv=None) -> int:
    from jaxrl_llm.benchmarks.common.rl_batch import GROUP, TINY_MIX, LengthMix, rl_length_mix
    from jaxrl_llm.benchmarks.common.model_shapes import MODELS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen2.5-1.5b", choices=sorted(MODELS))
    parser.add_argument("--tokens", type=int, default=16384, help="tokens per step (rl_length_mix's target)")
    parser.add_argument("--micro-batch-tokens", type=int, default=8192)
    parser.add_argument("--modes", default="eager,compile,packed", help="eager, compile, packed (packed eager)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--tiny", action="store_true", help="tiny model, CPU: the code path only")
    parser.add_argument("--json", required=True)
    args = parser.parse_args(argv)
    import torch

    mix = TINY_MIX if args.tiny else LengthMix()
    shape = MODELS["tiny" if args.tiny else args.model]
    seq, rewards = rl_length_mix(args.tokens, mix, shape["vocab_size"])
    advantages = np.repeat(rewards - rewards.mean(1, keepdims=True), 1, axis=0).reshape(-1)
    weights = seq.completion_mask * advantages[:, None] / max(float(seq.completion_mask.sum()), 1.0)
    width = seq.tokens.shape[1]
    rows_per_micro = max(1, args.micro_batch_tokens // width)
    device = "cuda" if torch.cuda.is_available() and not args.tiny else "cpu"
    out = {"model": args.model if not args.tiny else "tiny", "tokens_per_step": int(seq.attention_mask.sum()),
           "target_tokens": args.tokens,
           "sequences": int(seq.tokens.shape[0]), "group": GROUP, "rows_per_micro_batch": rows_per_micro,
           "row_width": width, "layout": "one per row", "runs": []}
    for mode in args.modes.split(","):
        if mode not in ("eager", "compile", "packed"):
            parser.error(f"--modes entry {mode!r} is unknown; valid: eager, compile, packed")
        try:
            packed = packed_micro_batches(seq, weights, rows_per_micro) if mode == "packed" else None
            run = torch_step_rate(shape, seq.tokens, seq.attention_mask, weights, seq.prompt_width,
                                  rows_per_micro=rows_per_micro, compiled=mode == "compile",
                                  steps=args.steps, warmup=2 if mode == "compile" else 1, device=device,
                                  packed=packed)
        except Exception as error:  # one mode failing keeps the other's result
            out.setdefault("failed", []).append({"mode": mode, "error": f"{type(error).__name__}: {error}"[-800:]})
            print(f"[torch_learner] {mode} failed: {error}", flush=True)
        else:
            out["runs"].append(run)
            print(f"[torch_learner] {mode}: {run['seconds']:.3f} s/step", flush=True)
        with open(args.json, "w") as f:  # after every mode: a timeout keeps what finished
            json.dump(out, f, indent=2)
    return 0 if out["runs"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
