"""LoRA: low-rank adapters on the attention and MLP projections (Hu et al. 2021,
"LoRA: Low-Rank Adaptation of Large Language Models").

A frozen matrix W [in, out] (our [in, out] layout, see ``decoder.py``) becomes

    W' = W + (alpha / r) * A @ B,    A [in, r], B [r, out]

A is drawn at random and B is zero, so W' = W at initialisation (the model
starts as the base model, exactly) and only A and B are trained. Hu et al.
draw A Gaussian; we use N(0, 1/in) (the "fan-in" scale, so x @ A has the
per-element size of x) and scale the update by alpha / r so that changing r
does not call for a new learning rate (Hu et al. section 4.1).

Adapters are their own pytree, layers stacked on the leading axis like the base::

    {"layers": {"q_proj": {"a": [nL, in, r], "b": [nL, r, out]}, "v_proj": {...}, ...}}

``merge(base, adapters, scale)`` is a pure function that returns full params
in the base layout; the learner calls it inside its loss, so gradients reach
only the adapters, the base weights stay frozen (and can be shared with a
reference model), and every consumer of full params (JAX sampler, vLLM
export, ``bridge.save_hf_dir``) works unchanged. Merging every step costs one
[in, r] x [r, out] product per target matrix, small next to the forward pass
for models of SmolLM2's size; an unmerged x @ W + (x @ A) @ B forward would
save the temporary merged copy but needs changes inside the decoder.

Several adapters on one batch (``GroupedLora``, the Tinker server's clients sharing one base
model) run unmerged instead: the batch's rows come in consecutive groups, one per adapter, and
each adapted projection adds, per group g of rows,

    y[rows of g] = x[rows of g] @ W + (x[rows of g] @ A_g) @ (s_g B_g)

so the base matmuls run once for the whole batch and only the rank-r products per group
(``grouped_delta``; the decoder's ``forward(..., lora=)``). A group's rows depend only on its own
A_g and B_g, so the gradient of a sum of per-group losses with respect to them is that group's
own gradient.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

# The projections LoRA may adapt: params["layers"] keys holding [nL, in, out] matrices.
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class LoraSpec:
    """rank r >= 1, alpha > 0 (update scale alpha / r), and the target projections."""

    rank: int
    alpha: float
    targets: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self):
        if isinstance(self.rank, bool) or not isinstance(self.rank, (int, np.integer)) or self.rank < 1:
            raise ValueError(f"LoRA rank={self.rank!r}; valid: an integer >= 1")
        if not np.isfinite(self.alpha) or self.alpha <= 0:
            raise ValueError(f"LoRA alpha={self.alpha!r}; valid: a finite number > 0")
        targets = tuple(self.targets)
        unknown = [t for t in targets if t not in LORA_TARGETS]
        if unknown or not targets or len(set(targets)) != len(targets):
            raise ValueError(f"LoRA targets={targets!r}; valid: a non-empty set of distinct names from {LORA_TARGETS}")
        object.__setattr__(self, "targets", targets)

    @property
    def scale(self) -> float:
        return float(self.alpha) / int(self.rank)


def _check_base(base: Mapping[str, Any], spec: LoraSpec) -> None:
    layers = base.get("layers", {})
    for name in spec.targets:
        if name not in layers:
            raise ValueError(f"LoRA target {name!r} is not in params['layers'] (has: {sorted(layers)})")
        if np.ndim(layers[name]) != 3:
            raise ValueError(f"params['layers'][{name!r}] has shape {np.shape(layers[name])}; "
                             "LoRA needs a stacked [nL, in, out] matrix")


def init_adapters(base: Mapping[str, Any], spec: LoraSpec, rng: jax.Array, dtype: Any = jnp.float32) -> dict:
    """Adapters for ``base`` (arrays or ShapeDtypeStructs): A ~ N(0, 1/in), B = 0."""
    _check_base(base, spec)
    keys = jax.random.split(rng, len(spec.targets))
    layers = {}
    for key, name in zip(keys, spec.targets):
        num_layers, fan_in, fan_out = np.shape(base["layers"][name])
        a = jax.random.normal(key, (num_layers, fan_in, spec.rank), dtype) * (fan_in ** -0.5)
        layers[name] = {"a": a.astype(dtype), "b": jnp.zeros((num_layers, spec.rank, fan_out), dtype)}
    return {"layers": layers}


def adapter_shapes(base: Mapping[str, Any], spec: LoraSpec, dtype: Any = jnp.float32) -> dict:
    """The adapters pytree as ShapeDtypeStructs, without allocating anything."""
    return jax.eval_shape(lambda: init_adapters(base, spec, jax.random.PRNGKey(0), dtype))


def check_adapters(adapters: Mapping[str, Any], base: Mapping[str, Any]) -> None:
    """Every adapted name exists in ``base`` and A [nL, in, r], B [nL, r, out] fit its matrix."""
    layers = adapters.get("layers") if isinstance(adapters, Mapping) else None
    if not isinstance(layers, Mapping) or set(adapters) != {"layers"} or not layers:
        raise ValueError(f"adapters must be {{'layers': {{name: {{'a', 'b'}}}}}}, got keys "
                         f"{sorted(adapters) if isinstance(adapters, Mapping) else type(adapters).__name__}")
    for name, pair in layers.items():
        if name not in LORA_TARGETS or name not in base["layers"]:
            valid = [t for t in LORA_TARGETS if t in base["layers"]]
            raise ValueError(f"adapter {name!r} has no base matrix; valid: {valid}")
        if set(pair) != {"a", "b"}:
            raise ValueError(f"adapter {name!r} has keys {sorted(pair)}; valid: ['a', 'b']")
        num_layers, fan_in, fan_out = np.shape(base["layers"][name])
        a, b = np.shape(pair["a"]), np.shape(pair["b"])
        if len(a) != 3 or len(b) != 3 or a[:2] != (num_layers, fan_in) or b[0] != num_layers \
                or b[2] != fan_out or a[2] != b[1]:
            raise ValueError(f"adapter {name!r}: A {a}, B {b} do not fit W {(num_layers, fan_in, fan_out)}; "
                             f"valid: A ({num_layers}, {fan_in}, r), B ({num_layers}, r, {fan_out})")


def delta(pair: Mapping[str, Any], scale: float) -> jax.Array:
    """scale * A @ B per layer: [nL, in, r] x [nL, r, out] -> [nL, in, out], in float32."""
    a, b = jnp.asarray(pair["a"], jnp.float32), jnp.asarray(pair["b"], jnp.float32)
    return scale * jnp.einsum("lir,lro->lio", a, b, precision=jax.lax.Precision.HIGHEST)


def merge(base: Mapping[str, Any], adapters: Mapping[str, Any], scale: float) -> dict:
    """Full params: W + scale * A @ B for every adapted matrix (summed in float32, cast
    back to W's dtype); all other leaves are ``base``'s own arrays. Pure and jittable."""
    layers = dict(base["layers"])
    for name, pair in adapters["layers"].items():
        weight = layers[name]
        layers[name] = (jnp.asarray(weight, jnp.float32) + delta(pair, scale)).astype(weight.dtype)
    return {**base, "layers": layers}


@dataclasses.dataclass(frozen=True)
class GroupedLora:
    """Adapters of a batch in row groups: rows[g] consecutive rows (static) use factors[g] =
    {name: {"a": [nL, in, r_g], "b": [nL, r_g, out]}} with that adapter's scale already in "b"
    (ranks and adapted names may differ between groups; a name absent from a group adds nothing)."""

    factors: tuple[dict, ...]
    rows: tuple[int, ...]


def grouped_delta(y: jax.Array, x: jax.Array, factors: Sequence[Mapping[str, Any]], name: str,
                  rows: Sequence[int]) -> jax.Array:
    """y [B, T, out] (= x @ W) plus each row group's LoRA term of matrix ``name``: x [B, T, in] is cut
    into groups of rows[g] rows and group g's rows get (x @ A_g) @ B_g (one layer's factors[g][name],
    A [in, r], B [r, out]); unchanged when no group adapts ``name``."""
    if all(name not in f for f in factors):
        return y
    parts, start = [], 0
    for group, n in zip(factors, rows):
        part = x[start:start + n]
        if name in group:
            pair = group[name]
            low = jnp.matmul(part, pair["a"], precision=jax.lax.Precision.HIGHEST)
            parts.append(jnp.matmul(low, pair["b"], precision=jax.lax.Precision.HIGHEST).astype(y.dtype))
        else:
            parts.append(jnp.zeros((n, *y.shape[1:]), y.dtype))
        start += n
    if start != x.shape[0]:
        raise ValueError(f"GroupedLora rows {tuple(rows)} cover {start} rows; the batch has {x.shape[0]}")
    return y + jnp.concatenate(parts)


def tree_bytes(tree: Any) -> int:
    """Bytes held by the array leaves of a pytree (arrays or ShapeDtypeStructs)."""
    return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def base_fingerprint(model_dir: str | os.PathLike) -> str:
    """sha256 over the names and bytes of a checkpoint directory's config.json and
    *.safetensors files: identifies the base weights an adapter checkpoint needs."""
    model_dir = os.fspath(model_dir)
    names = sorted(n for n in os.listdir(model_dir) if n == "config.json" or n.endswith(".safetensors"))
    if not any(n.endswith(".safetensors") for n in names):
        raise FileNotFoundError(f"{model_dir!r} holds no *.safetensors; valid: an HF checkpoint directory")
    digest = hashlib.sha256()
    for name in names:
        digest.update(name.encode() + b"\0")
        with open(os.path.join(model_dir, name), "rb") as f:
            for block in iter(lambda: f.read(1 << 24), b""):
                digest.update(block)
    return digest.hexdigest()


MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")  # a dense layer's MLP; a MoE layer has experts instead


def targets_for_model(targets: Sequence[str], model_cfg: Any = None) -> tuple[str, ...]:
    """The LoRA targets for ``model_cfg``: as given for a dense model; for a mixture of experts
    (``model_cfg.is_moe``) the default (every projection) keeps only the attention projections
    (the experts and the router stay frozen), and explicitly named MLP projections are refused."""
    targets = tuple(targets)
    if not getattr(model_cfg, "is_moe", False):
        return targets
    if targets == LORA_TARGETS:
        return tuple(t for t in targets if t not in MLP_TARGETS)
    mlp = [t for t in targets if t in MLP_TARGETS]
    if mlp:
        attention = tuple(t for t in LORA_TARGETS if t not in MLP_TARGETS)
        raise ValueError(f"train.lora_targets names {mlp}, but the policy is a mixture of experts (its MLPs are "
                         f"experts, which LoRA does not adapt); valid: {attention}")
    return targets


def spec_from_train_config(train_cfg: Any, model_cfg: Any = None) -> LoraSpec | None:
    """LoraSpec from TrainConfig's lora_* fields (targets fitted to ``model_cfg`` by
    `targets_for_model`); None when lora_rank is 0 (full fine-tuning)."""
    rank = int(getattr(train_cfg, "lora_rank", 0) or 0)
    if rank == 0:
        return None
    return LoraSpec(rank=rank, alpha=float(train_cfg.lora_alpha),
                    targets=targets_for_model(train_cfg.lora_targets, model_cfg))


__all__: Sequence[str] = ("LORA_TARGETS", "MLP_TARGETS", "LoraSpec", "targets_for_model",
                          "init_adapters", "adapter_shapes", "check_adapters", "delta", "GroupedLora", "grouped_delta",
                          "merge", "tree_bytes", "base_fingerprint", "spec_from_train_config")
