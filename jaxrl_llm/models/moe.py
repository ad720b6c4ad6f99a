"""Mixture-of-experts MLP of the Qwen3-MoE family: a top-k softmax router over SwiGLU experts.

Parameter layout of one MoE layer (``decoder.py`` stacks it on the leading layer axis nL and
uses it instead of gate_proj/up_proj/down_proj; matrices [in, out] like the dense ones)::

    "router":      [nL, D, E]      HF  model.layers.N.mlp.gate.weight               [E, D]
    "expert_gate": [nL, E, D, F]   HF  model.layers.N.mlp.experts.e.gate_proj.weight [F, D]
    "expert_up":   [nL, E, D, F]   HF  model.layers.N.mlp.experts.e.up_proj.weight   [F, D]
    "expert_down": [nL, E, F, D]   HF  model.layers.N.mlp.experts.e.down_proj.weight [D, F]

E = ``num_experts``, F = ``moe_intermediate_size``, k = ``num_experts_per_tok``.

The block, per token x (Shazeer et al. 2017, "Outrageously Large Neural Networks: The
Sparsely-Gated Mixture-of-Experts Layer"; Qwen3-MoE's variant as transformers'
``Qwen3MoeSparseMoeBlock`` computes it)::

    p      = softmax(x @ router)                     in float32, over the E experts
    S      = the k experts of largest p              (``top_k_experts``; descending p)
    g_e    = p_e  for e in S,  divided by sum_{e in S} p_e  when ``norm_topk_prob``
    y      = sum_{e in S} g_e * down_e(silu(gate_e(x)) * up_e(x))

No token is dropped (there is no capacity limit). The experts run in one of two exact forms
(``DecoderConfig.moe_experts``, ``MOE_EXPERT_FORMS``):

* ``"ragged"`` (``experts_ragged``): the N tokens' N*k (token, expert) pairs sorted by expert, each
  expert's SwiGLU on its own rows only as grouped matmuls (``jax.lax.ragged_dot`` with the experts'
  row counts as group sizes), weighted by the gates, put back in token order and summed over the k:
  the active FLOPs. On TPU ragged_dot is one instruction; on GPU XLA's or a Triton kernel.
* ``"dense"`` (``experts_swiglu``): every expert's SwiGLU on every token, the gates of unselected
  experts exactly 0: E/k times the active FLOPs (16x for Qwen3-30B-A3B), but plain dense matmuls.
* ``"auto"`` (the default): chosen by the platform the program is lowered for
  (``jax.lax.platform_dependent``), not the local backend, so an ahead-of-time compile for a TPU
  topology on a CPU machine gets the TPU's form. On CPU the dense form: XLA:CPU has no ragged matmul,
  JAX lowers ragged_dot there to a masked dense product over all E groups of all N*k rows (k times
  the dense form's FLOPs). On TPU and GPU ``experts_ragged_dense_grad``: the ragged forward (the
  sampler, the pi_old and reference passes: the active FLOPs) with the dense form's gradient, because
  XLA:TPU computes ragged_dot's weight gradient as a masked product over all E groups (a Qwen3-30B-A3B
  block's forward + backward: ragged 43x the active FLOPs, dense 14x). Measured: docs/benchmarks.md,
  "MoE experts". A grouped weight-gradient kernel (megablox's tgmm: 1.02x, but a Pallas call that the
  SPMD partitioner cannot split without a shard_map) is left for later.

Both forms give the same numbers up to float rounding (tests/models/test_moe_experts.py). The
batch-invariant blocks (``models.batch_invariant``) always take the dense form: a ragged product's
rows depend on how many rows each expert got in the batch.

Routing replay (R3: Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training
and Inference Routers", arXiv 2510.11370): given the experts S' another engine chose for a token,
the block uses S' instead of its own top-k, and the gates are the CURRENT router's probabilities at
S' (renormalised over S' when ``norm_topk_prob``), so the router still receives gradients through
the gates. A token whose replay row holds a negative entry (-1: the sampler has no record of it,
e.g. padding or the last sampled token) is routed by the router's own top-k instead. This is what Megatron-LM's ``RouterReplay.get_replay_topk``
(megatron/core/transformer/moe/router_replay.py: ``probs = scores.gather(1, top_indices)``) does,
which verl's router replay (verl/utils/megatron/router_replay_patch.py) and slime's routing replay
(slime/utils/routing_replay.py) build on. Recording and replaying share one code path
(``gate_weights`` on the chosen experts), so replaying a model's own record reproduces its
logits bit for bit.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple

import jax
import jax.numpy as jnp

MOE_PARAM_NAMES = ("router", "expert_gate", "expert_up", "expert_down")


class Routing(NamedTuple):
    """What a MoE forward routed, per token: ``experts`` [B, T, nL, k] int32 (each layer's k
    experts, by descending router probability unless replayed) and ``router_logits``
    [B, T, nL, E] float32 (the router's logits; the losses and metrics of ``router_losses``)."""
    experts: jax.Array
    router_logits: jax.Array


class RoutedForward(NamedTuple):
    """``decoder.forward(..., return_routing=True)``: logits (or final hidden), the new cache
    (None without one) and the Routing."""
    out: jax.Array
    cache: dict | None
    routing: Routing


class LayerRouting(NamedTuple):
    """One layer's part of a Routing: experts [B, T, k], router_logits [B, T, E]."""
    experts: jax.Array
    router_logits: jax.Array


def moe_param_shapes(hidden: int, num_experts: int, width: int) -> dict[str, tuple[int, ...]]:
    """One layer's MoE params (no layer axis): name -> shape, in MOE_PARAM_NAMES order."""
    return {"router": (hidden, num_experts), "expert_gate": (num_experts, hidden, width),
            "expert_up": (num_experts, hidden, width), "expert_down": (num_experts, width, hidden)}


def router_logits(x: jax.Array, router: jax.Array) -> jax.Array:
    """x [..., D] @ router [D, E] -> [..., E], accumulated and returned in float32."""
    return jnp.einsum("...d,de->...e", x, router.astype(x.dtype), preferred_element_type=jnp.float32)


def top_k_experts(probs: jax.Array, k: int) -> jax.Array:
    """The k experts of largest probability [..., k] int32, in descending order (ties: lower index first)."""
    return jax.lax.top_k(probs, k)[1].astype(jnp.int32)


def gate_weights(probs: jax.Array, experts: jax.Array, normalize: bool) -> jax.Array:
    """probs [..., E] at experts [..., k] -> [..., k]; divided by their sum when ``normalize``
    (Qwen3-MoE's ``norm_topk_prob``). Indices outside [0, E) give NaN (a bad replay shows up)."""
    gates = jnp.take_along_axis(probs, experts, axis=-1, mode="fill", fill_value=jnp.nan)
    return gates / jnp.sum(gates, axis=-1, keepdims=True) if normalize else gates


def combine_weights(gates: jax.Array, experts: jax.Array, num_experts: int) -> jax.Array:
    """Dense per-expert weights [..., E]: gates[j] at experts[j], 0 for every unselected expert."""
    return jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=gates.dtype) * gates[..., None], axis=-2)


def experts_swiglu(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array,
                   combine: jax.Array) -> jax.Array:
    """sum_e combine[..., e] * down_e(silu(gate_e(x)) * up_e(x)) for x [..., D] (Shazeer 2020, SwiGLU),
    every expert on every token; matmuls accumulate in float32, the result is in x's dtype."""
    dtype = x.dtype
    gate = jnp.einsum("...d,edf->...ef", x, w_gate.astype(dtype), preferred_element_type=jnp.float32)
    up = jnp.einsum("...d,edf->...ef", x, w_up.astype(dtype), preferred_element_type=jnp.float32)
    hidden = (jax.nn.silu(gate.astype(dtype)) * up.astype(dtype)).astype(jnp.float32) * combine[..., None]
    out = jnp.einsum("...ef,efd->...d", hidden.astype(dtype), w_down.astype(dtype),
                     preferred_element_type=jnp.float32)
    return out.astype(dtype)


def experts_ragged(x: jax.Array, w_gate: jax.Array, w_up: jax.Array, w_down: jax.Array, experts: jax.Array,
                   gates: jax.Array) -> jax.Array:
    """sum_j gates[..., j] * down_e(silu(gate_e(x)) * up_e(x)) at e = experts[..., j], for x [..., D] and
    experts, gates [..., k]: each expert's SwiGLU on the rows routed to it only (grouped matmuls,
    ``jax.lax.ragged_dot``). Rounded where ``experts_swiglu`` rounds (matmuls accumulate in float32,
    the gate weights the hidden units in float32 before the down matmul); the result is in x's dtype.
    An expert index outside [0, E) gives NaN, as in the dense form."""
    dtype, width, top_k, num_experts = x.dtype, x.shape[-1], experts.shape[-1], w_gate.shape[0]
    pairs = experts.reshape(-1)  # [N*k]: token n's j-th expert at n*k + j
    order = jnp.argsort(pairs, stable=True)  # the pairs grouped by expert, in token order within each
    rows = x.reshape(-1, width)[order // top_k]  # [N*k, D]
    sizes = jnp.bincount(pairs, length=num_experts).astype(jnp.int32)  # rows per expert (the groups)

    def grouped(lhs, weights):
        return jax.lax.ragged_dot(lhs, weights.astype(dtype), sizes, preferred_element_type=jnp.float32)

    gate, up = grouped(rows, w_gate), grouped(rows, w_up)
    hidden = (jax.nn.silu(gate.astype(dtype)) * up.astype(dtype)).astype(jnp.float32)
    hidden = hidden * gates.reshape(-1)[order][:, None].astype(jnp.float32)
    out = grouped(hidden.astype(dtype), w_down)  # [N*k, D], the pairs in expert order
    in_token_order = jnp.zeros_like(out).at[order].set(out, unique_indices=True)
    y = jnp.sum(in_token_order.reshape(*experts.shape, width), axis=-2)
    bad = jnp.sum(gates, axis=-1, keepdims=True) * 0.0  # NaN where a gate is (a bad index), else 0
    return (y + bad).astype(dtype)


@jax.custom_vjp
def experts_ragged_dense_grad(x, weights, experts, gates):
    """``experts_ragged``'s values with the dense form's gradients: what "auto" computes on TPU and GPU.
    XLA:TPU computes ragged_dot's weight gradient (its transpose in the contracting dimension) as a
    masked product over all E groups: E times the active FLOPs of that matmul, 43x a Qwen3-30B-A3B
    block's active forward + backward against the dense form's 14x (docs/benchmarks.md). So the
    forward (the sampler, the pi_old and reference passes) takes the active FLOPs and a gradient costs
    what the dense form's does (its forward recomputed, then its backward)."""
    return experts_ragged(x, weights["expert_gate"], weights["expert_up"], weights["expert_down"], experts, gates)


def _hybrid_fwd(x, weights, experts, gates):
    return experts_ragged_dense_grad(x, weights, experts, gates), (x, weights, experts, gates)


def _hybrid_bwd(residual, grad):
    x, weights, experts, gates = residual

    def dense(x, weights, gates):
        combine = combine_weights(gates, experts, weights["expert_gate"].shape[0])
        return experts_swiglu(x, weights["expert_gate"], weights["expert_up"], weights["expert_down"], combine)

    d_x, d_weights, d_gates = jax.vjp(dense, x, weights, gates)[1](grad)
    return d_x, d_weights, None, d_gates


experts_ragged_dense_grad.defvjp(_hybrid_fwd, _hybrid_bwd)


MOE_EXPERT_FORMS = ("auto", "ragged", "dense")


def routed_experts(x: jax.Array, weights: Mapping[str, jax.Array], experts: jax.Array, gates: jax.Array,
                   form: str) -> jax.Array:
    """The experts' output for x [..., D] routed to experts with gates [..., k], in ``form``
    (``MOE_EXPERT_FORMS``; module docstring)."""
    def dense(x, weights, experts, gates):
        combine = combine_weights(gates, experts, weights["expert_gate"].shape[0])
        return experts_swiglu(x, weights["expert_gate"], weights["expert_up"], weights["expert_down"], combine)

    def ragged(x, weights, experts, gates):
        return experts_ragged(x, weights["expert_gate"], weights["expert_up"], weights["expert_down"], experts, gates)

    if form == "dense":
        return dense(x, weights, experts, gates)
    if form == "ragged":
        return ragged(x, weights, experts, gates)
    if form == "auto":
        return jax.lax.platform_dependent(x, weights, experts, gates, cpu=dense, default=experts_ragged_dense_grad)
    raise ValueError(f"moe_experts={form!r}; valid: {MOE_EXPERT_FORMS}")


def replayed_or_own(replay: jax.Array, own: jax.Array) -> jax.Array:
    """replay [..., k] where its token row is a record, the router's own top-k ``own`` [..., k] where
    it is not: a row with any entry < 0 (the learner writes -1 on padding and on the last sampled
    token, which the sampler never forwarded) takes the router's own top-k as a whole."""
    missing = jnp.any(replay < 0, axis=-1, keepdims=True)
    return jnp.where(missing, own, replay.astype(jnp.int32))


def moe_mlp(x: jax.Array, weights: Mapping[str, jax.Array], top_k: int, normalize: bool,
            replay: jax.Array | None = None, form: str = "auto") -> tuple[jax.Array, LayerRouting]:
    """The MoE block on x [B, T, D] -> (y [B, T, D], LayerRouting). ``replay`` [B, T, k] int32:
    use these experts instead of the router's top-k; gates from the current router (module docstring).
    A replay row with an entry < 0 (-1: no record) routes that token by the router's own top-k.
    ``form``: how the experts are computed (``MOE_EXPERT_FORMS``)."""
    logits = router_logits(x, weights["router"])
    probs = jax.nn.softmax(logits, axis=-1)
    experts = top_k_experts(probs, top_k)
    if replay is not None:
        experts = replayed_or_own(replay, experts)
    y = routed_experts(x, weights, experts, gate_weights(probs, experts, normalize), form)
    return y, LayerRouting(experts, logits)


def stack_layer_routing(per_layer: LayerRouting) -> Routing:
    """The scan's stacked [nL, B, T, ...] LayerRouting -> Routing [B, T, nL, ...]."""
    return Routing(jnp.moveaxis(per_layer.experts, 0, 2), jnp.moveaxis(per_layer.router_logits, 0, 2))


def replay_experts_per_layer(routing: Any, batch: int, length: int, num_layers: int, top_k: int) -> jax.Array:
    """A Routing or an experts array [B, T, nL, k] -> [nL, B, T, k] int32 for the layer scan;
    ValueError naming the shape when it does not fit the tokens and the config."""
    experts = routing.experts if isinstance(routing, Routing) else routing
    want = (batch, length, num_layers, top_k)
    if tuple(experts.shape) != want:
        raise ValueError(f"routing experts have shape {tuple(experts.shape)}; valid: {want} "
                         "([batch, time, num_layers, num_experts_per_tok])")
    if not jnp.issubdtype(experts.dtype, jnp.integer):
        raise ValueError(f"routing experts have dtype {experts.dtype}; valid: an integer dtype")
    return jnp.moveaxis(jnp.asarray(experts, jnp.int32), 2, 0)


MOE_FAMILIES = ("qwen3_moe", "mixtral")


def check_moe_fields(family: str, experts: int, top_k: int, width: int, normalize: bool = False) -> None:
    """qwen3_moe / mixtral need 1 <= num_experts_per_tok <= num_experts and a positive expert width
    (mixtral: renormalised gates, norm_topk_prob=True); dense families none of these."""
    if family not in MOE_FAMILIES:
        if experts or top_k or width:
            raise ValueError(f"family={family!r} is dense: num_experts={experts}, num_experts_per_tok={top_k}, "
                             f"moe_intermediate_size={width} must be 0 (mixtures of experts: {MOE_FAMILIES})")
        return
    for name, value in (("num_experts", experts), ("num_experts_per_tok", top_k), ("moe_intermediate_size", width)):
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{name}={value!r} must be a positive int for family={family!r}")
    if top_k > experts:
        raise ValueError(f"num_experts_per_tok={top_k} must be <= num_experts={experts}")
    if family == "mixtral" and not normalize:
        raise ValueError("family='mixtral' always renormalises its top-k gates; valid: norm_topk_prob=True")


def parse_moe_fields(hf: Mapping[str, Any], architecture: str, defaults: Mapping[str, Any]) -> dict:
    """The MoE fields of a Qwen3-MoE or Mixtral config.json (``defaults`` for absent keys); only
    all-sparse layouts (every layer a mixture of experts) are supported, others raise naming the value.
    Mixtral: experts of width ``intermediate_size``, gates always renormalised, no sliding window."""
    def get(key):
        return defaults[key] if hf.get(key) is None else hf[key]

    if get("decoder_sparse_step") != 1:
        raise ValueError(f"{architecture}: decoder_sparse_step={get('decoder_sparse_step')!r} is not supported; "
                         "valid: 1 (every layer a mixture of experts)")
    if list(get("mlp_only_layers")):
        raise ValueError(f"{architecture}: mlp_only_layers={get('mlp_only_layers')!r} is not supported; valid: [] "
                         "(every layer a mixture of experts)")
    experts = hf.get("num_local_experts") if hf.get("num_experts") is None else hf["num_experts"]  # transformers 5
    experts = defaults["num_experts"] if experts is None else experts  # writes num_local_experts
    if architecture == "MixtralForCausalLM":
        if hf.get("sliding_window") is not None:
            raise ValueError(f"{architecture}: sliding_window={hf['sliding_window']!r} is not supported; valid: null")
        experts = hf.get("num_local_experts") or hf.get("num_experts") or 8  # MixtralConfig's defaults
        return dict(num_experts=int(experts), num_experts_per_tok=int(hf.get("num_experts_per_tok") or 2),
                    moe_intermediate_size=int(hf["intermediate_size"]), norm_topk_prob=True)
    return dict(num_experts=int(experts), num_experts_per_tok=int(get("num_experts_per_tok")),
                moe_intermediate_size=int(get("moe_intermediate_size")), norm_topk_prob=bool(get("norm_topk_prob")))
