"""Llama / Qwen2 / Qwen3 / Qwen3-MoE / Mixtral decoder in Flax linen, with a KV cache.

Parameter layout (a plain nested dict; ``jaxrl_llm.bridge`` relies on it).
Layers are stacked on a leading axis of size nL (``nn.scan``); matrices are
stored [in, out], i.e. the HF ``nn.Linear.weight`` transposed::

    {"embed": [V, D],
     "layers": {"input_norm": [nL, D],
                "q_proj": [nL, D, Hq*hd], "k_proj": [nL, D, Hkv*hd], "v_proj": [nL, D, Hkv*hd],
                "o_proj": [nL, Hq*hd, D],
                "q_bias": [nL, Hq*hd], "k_bias": [nL, Hkv*hd], "v_bias": [nL, Hkv*hd]   # cfg.qkv_bias
                "o_bias": [nL, D]                                                     # cfg.o_bias
                "q_norm": [nL, hd], "k_norm": [nL, hd]                                # cfg.qk_norm (qwen3)
                "post_norm": [nL, D],
                "gate_proj": [nL, D, F], "up_proj": [nL, D, F], "down_proj": [nL, F, D]},  # dense;
                # MoE instead: "router", "expert_gate", "expert_up", "expert_down" (models.moe)
     "final_norm": [D],
     "lm_head": [D, V]}                                                               # only if not tied

``o_bias`` exists only for Llama/Qwen3 configs with ``attention_bias=True``
(HF gives o_proj a bias there; Qwen2 never has one).

One block (pre-norm residual; Touvron et al. 2023, "LLaMA")::

    h = x + o_proj(attention(rope(q), rope(k), v))   with q, k, v from input_norm(x)
    y = h + down_proj(silu(gate_proj(n)) * up_proj(n)),  n = post_norm(h)

RMSNorm: x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019), statistics in
float32. Rotary embedding in HF's "rotate_half" layout (Su et al. 2021,
RoFormer): for dims split into halves (x1, x2),
rope(x) = x * cos(p * f) + concat(-x2, x1) * sin(p * f), f_i = theta^(-2i/hd),
so HF checkpoints load without permuting q/k rows. Attention is causal
softmax(q k^T / sqrt(hd)) v with grouped KV heads (Ainslie et al. 2023).

Batches and padding:

* Padded batches (training): pass ``attention_mask`` [B, T] (1 = token,
  0 = padding); right or left padding, the real tokens get positions 0, 1, ...
  Outputs at padded positions are finite but meaningless.
* Packed sequences: pass ``segment_ids`` [B, T] (0 = padding, each sequence a
  contiguous run of one id); positions default to restarting at 0 in each run.
* KV cache (sampling): prompts are LEFT-padded to a common length and
  written at the same slots for every row. ``cache["next_pos"]`` holds each
  row's next position, so with ``attention_mask`` marking the left padding,
  a prefill gives the real tokens positions 0..L_b-1 and each later decode
  step continues at L_b, L_b+1, ... Padded slots are never attended to.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxrl_llm.models import batch_invariant as invariant
from jaxrl_llm.models.config import DecoderConfig, canonical_dtype_name
from jaxrl_llm.models.attention import (ATTENTION_BLOCKS, MIN_ATTENTION_BLOCK,  # noqa: F401  (importable from here)
                                        attention_block_size, cache_window_sizes, causal_attention, grouped_attention,
                                        shared_slot_attention, windowed_cache_attention)
from jaxrl_llm.models.decode_attention import slot_cache_attention
from jaxrl_llm.models.fused_attention import segment_spans, use_cudnn_attention, use_cudnn_segments
from jaxrl_llm.models.lora import GroupedLora, grouped_delta
from jaxrl_llm.models.matmul import low_precision_logits, project
from jaxrl_llm.models.platform import target_platform
from jaxrl_llm.models.moe import RoutedForward, Routing, moe_mlp, moe_param_shapes, replay_experts_per_layer, stack_layer_routing
from jaxrl_llm.models.remat import remat_mode, remat_policy
from jaxrl_llm.models.rotary import apply_rope, rope_inverse_frequencies  # noqa: F401  (importable from here)

Params = dict[str, Any]


def jnp_dtype(name: Any) -> jnp.dtype:
    return jnp.dtype(canonical_dtype_name(name))


# ---------------------------------------------------------------- pure pieces
def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """x / sqrt(mean(x^2) + eps) * weight, statistics in float32, result in x's dtype (as HF)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def lm_head_logits(hidden: jax.Array, params: Params, cfg: DecoderConfig) -> jax.Array:
    """Logits [..., V] in float32 from final-normed hidden [..., D] (tied: embed^T)."""
    hidden = hidden.astype(jnp_dtype(cfg.compute_dtype))
    if cfg.tie_word_embeddings:
        weight = params["embed"].astype(hidden.dtype)
        if hidden.dtype == jnp.bfloat16:  # bf16 operands in the backward too (models.matmul)
            return low_precision_logits(hidden, weight)
        return jnp.einsum("...d,vd->...v", hidden, weight, preferred_element_type=jnp.float32)
    weight = params["lm_head"].astype(hidden.dtype)
    return jnp.einsum("...d,dv->...v", hidden, weight, preferred_element_type=jnp.float32)


# ---------------------------------------------------------------- modules
class DecoderLayer(nn.Module):
    """One pre-norm block; scanned over layers, so its params gain a leading nL axis.

    carry = (hidden [B, T, D], kv) with kv None or the whole cache {"k", "v": [nL, B, S, Hkv, hd]};
    the layer writes its keys/values at slot ``write_at`` of row ``layer_index`` in place.
    ``cache_window`` (slots, None: off): attend over the filled prefix of the cache only,
    in whole windows (`windowed_cache_attention`). ``decode_kernel`` (None: off): one token per row,
    written at the row's own slot ``write_at`` [B, 1] and attending over the row's slots up to it
    (`models.decode_attention`, this kernel; the slot decode of `rollout.decode_slots`).
    """

    cfg: DecoderConfig
    cache_window: int | None = None
    batch_invariant: bool = False  # models.batch_invariant.block; write_at: the slot of each token [B, T]
    decode_kernel: str | None = None
    lora_rows: tuple[int, ...] | None = None  # models.lora.GroupedLora.rows; its factors come as ``lora``

    def _param(self, name, shape, init):
        return self.param(name, init, shape, jnp_dtype(self.cfg.param_dtype))

    @nn.compact
    def __call__(self, carry, layer_index, replay, lora, positions, visible, write_at):
        cfg = self.cfg
        dtype = jnp_dtype(cfg.compute_dtype)
        if self.batch_invariant:
            inits = {"dense": nn.initializers.normal(0.02), "ones": nn.initializers.ones,
                     "zeros": nn.initializers.zeros}
            w = {name: self._param(name, shape, inits[init]).astype(dtype)
                 for name, shape, init in invariant.layer_param_specs(cfg)}
            hidden, kv, ops, routing = invariant.block(w, cfg, carry[0], carry[1], layer_index, positions, visible,
                                                       write_at, rope_inverse_frequencies(cfg),
                                                       record=self.is_mutable_collection("intermediates"),
                                                       replay=replay)
            for name, value in ops.items():  # each op's output, when the caller asks (mutable "intermediates")
                self.sow("intermediates", name, value)
            return (hidden, kv), routing
        dense_init = nn.initializers.normal(0.02)
        d, hd = cfg.hidden_size, cfg.head_dim
        hidden, kv = carry
        batch, length, _ = hidden.shape

        def linear(x, name, shape):
            y = project(x, self._param(name, shape, dense_init).astype(dtype))
            return y if lora is None else grouped_delta(y, x, lora, name, self.lora_rows)

        x = rms_norm(hidden, self._param("input_norm", (d,), nn.initializers.ones), cfg.rms_norm_eps)
        q = linear(x, "q_proj", (d, cfg.q_dim))
        k = linear(x, "k_proj", (d, cfg.kv_dim))
        v = linear(x, "v_proj", (d, cfg.kv_dim))
        if cfg.qkv_bias:
            q = q + self._param("q_bias", (cfg.q_dim,), nn.initializers.zeros).astype(dtype)
            k = k + self._param("k_bias", (cfg.kv_dim,), nn.initializers.zeros).astype(dtype)
            v = v + self._param("v_bias", (cfg.kv_dim,), nn.initializers.zeros).astype(dtype)
        q = q.reshape(batch, length, cfg.num_heads, hd)
        k = k.reshape(batch, length, cfg.num_kv_heads, hd)
        v = v.reshape(batch, length, cfg.num_kv_heads, hd)
        if cfg.qk_norm:
            q = rms_norm(q, self._param("q_norm", (hd,), nn.initializers.ones), cfg.rms_norm_eps)
            k = rms_norm(k, self._param("k_norm", (hd,), nn.initializers.ones), cfg.rms_norm_eps)
        inv_freq = rope_inverse_frequencies(cfg)
        q, k = apply_rope(q, positions, inv_freq), apply_rope(k, positions, inv_freq)

        if kv is None:  # no cache (the learner's forward): the keys are the row's own tokens, the mask causal
            attended = causal_attention(q, k, v, visible)
        elif self.decode_kernel is not None:  # one token per row at its own slot write_at [B, 1]
            kv, attended = slot_cache_attention(q, k, v, kv, layer_index, write_at, self.decode_kernel)
        else:  # this step's keys/values at the slot shared by all rows, attention over the cache row
            kv, attended = shared_slot_attention(q, k, v, kv, layer_index, visible, write_at, self.cache_window)
        attended = attended.reshape(batch, length, cfg.q_dim)
        attn_out = linear(attended, "o_proj", (cfg.q_dim, d))
        if cfg.o_bias:
            attn_out = attn_out + self._param("o_bias", (d,), nn.initializers.zeros).astype(dtype)
        hidden = hidden + attn_out

        x = rms_norm(hidden, self._param("post_norm", (d,), nn.initializers.ones), cfg.rms_norm_eps)
        if cfg.is_moe:  # models.moe; routing: this layer's experts and router logits
            shapes = moe_param_shapes(d, cfg.num_experts, cfg.moe_intermediate_size)
            weights = {name: self._param(name, shape, dense_init) for name, shape in shapes.items()}
            mlp_out, routing = moe_mlp(x, weights, cfg.num_experts_per_tok, cfg.norm_topk_prob, replay, cfg.moe_experts)
            return (hidden + mlp_out, kv), routing
        gate = linear(x, "gate_proj", (d, cfg.intermediate_size))
        up = linear(x, "up_proj", (d, cfg.intermediate_size))
        hidden = hidden + linear(nn.silu(gate) * up, "down_proj", (cfg.intermediate_size, d))
        return (hidden, kv), None


class Decoder(nn.Module):
    """Embedding -> nL scanned DecoderLayers -> final RMSNorm -> (optionally) LM head.

    Masks and positions are prepared by ``forward``; this module only computes.
    On GPU, float32 matmuls may run in TF32 unless ``jax.default_matmul_precision("highest")``
    is set: set it for float32 parity checks.
    """

    cfg: DecoderConfig
    remat: bool | str = False  # models.remat: "off", "dots", "full" (True = "full")
    cache_window: int | None = None
    batch_invariant: bool = False  # models.batch_invariant: a row's numbers independent of its batch and layout
    unroll_layers: bool = False  # one copy of the layer per layer instead of a loop (``unroll_layer_loop``)
    decode_kernel: str | None = None  # per-row cache slots (DecoderLayer; models.decode_attention)
    lora_rows: tuple[int, ...] | None = None  # row groups of ``lora`` (models.lora.GroupedLora)

    @nn.compact
    def __call__(self, tokens, positions, visible, kv=None, write_at=None, return_hidden=False, routing=None,
                 return_routing=False, lora=None):
        """-> (logits | hidden, kv), or (logits | hidden, kv, Routing) with ``return_routing`` (MoE configs).
        ``routing``: experts [B, T, nL, k] (or a Routing) to replay (``models.moe``)."""
        cfg = self.cfg
        param_dtype, dtype = jnp_dtype(cfg.param_dtype), jnp_dtype(cfg.compute_dtype)
        embed = self.param("embed", nn.initializers.normal(0.02), (cfg.vocab_size, cfg.hidden_size), param_dtype)
        hidden = jnp.take(embed, tokens, axis=0).astype(dtype)

        mode = remat_mode(self.remat)
        layer_cls = DecoderLayer
        if mode != "off":
            layer_cls = nn.remat(DecoderLayer, prevent_cse=False, policy=remat_policy(mode))
        layers = nn.scan(
            layer_cls,
            variable_axes={"params": 0, "intermediates": 0},
            split_rngs={"params": True},
            in_axes=(0, 0, 0, nn.broadcast, nn.broadcast, nn.broadcast),
            length=cfg.num_layers,
            unroll=cfg.num_layers if self.unroll_layers else 1,
        )(cfg, self.cache_window, self.batch_invariant, self.decode_kernel, self.lora_rows, name="layers")
        replay = None
        if routing is not None:
            if not cfg.is_moe:
                raise ValueError(f"routing replay needs a mixture-of-experts config; {cfg.architecture} is dense")
            replay = replay_experts_per_layer(routing, *tokens.shape, cfg.num_layers, cfg.num_experts_per_tok)
        (hidden, kv), per_layer = layers((hidden, kv), jnp.arange(cfg.num_layers), replay, lora, positions,
                                         visible, write_at)
        if return_routing and not cfg.is_moe:
            raise ValueError(f"return_routing=True needs a mixture-of-experts config; {cfg.architecture} is dense")

        final_norm = self.param("final_norm", nn.initializers.ones, (cfg.hidden_size,), param_dtype)
        norm = invariant.final_norm if self.batch_invariant else rms_norm
        hidden = norm(hidden, final_norm, cfg.rms_norm_eps)
        if self.batch_invariant:
            self.sow("intermediates", "final_norm", hidden)
        head = None
        if not cfg.tie_word_embeddings:
            head = self.param("lm_head", nn.initializers.normal(0.02), (cfg.hidden_size, cfg.vocab_size), param_dtype)
        out = hidden if return_hidden else lm_head_logits(hidden, {"embed": embed, "lm_head": head}, cfg)
        return (out, kv, stack_layer_routing(per_layer)) if return_routing else (out, kv)


# ---------------------------------------------------------------- functional API
def init_params(cfg: DecoderConfig, rng: jax.Array, dtype: Any = None) -> Params:
    """Random params (normal(0.02) matrices, unit norms, zero biases) in ``dtype``
    (default ``cfg.param_dtype``), as the plain nested dict documented above."""
    if dtype is not None:
        cfg = cfg.with_dtypes(param_dtype=dtype)
    dummy = (jnp.zeros((1, 1), jnp.int32), jnp.zeros((1, 1), jnp.int32), jnp.ones((1, 1, 1), bool))
    variables = jax.jit(Decoder(cfg).init)(rng, *dummy)  # jit: one compiled program, not op-by-op
    return dict(variables["params"])


def param_shapes(cfg: DecoderConfig, dtype: Any = None) -> Params:
    """The params pytree as jax.ShapeDtypeStruct leaves, without allocating anything."""
    return jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0), dtype))


def init_cache(cfg: DecoderConfig, batch: int, max_len: int, dtype: Any = None) -> dict:
    """Empty KV cache for ``batch`` rows of up to ``max_len`` tokens (prompt + generation).

    {"k", "v": [nL, B, max_len, Hkv, hd] (dtype, default cfg.compute_dtype),
     "mask": [B, max_len] bool (slot holds a real token),
     "end": int32 scalar (slots filled so far, shared by all rows),
     "next_pos": [B] int32 (position of each row's next real token)}
    """
    if batch <= 0 or max_len <= 0:
        raise ValueError(f"batch={batch} and max_len={max_len} must be positive")
    dtype = jnp_dtype(cfg.compute_dtype if dtype is None else dtype)
    shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
            "mask": jnp.zeros((batch, max_len), bool), "end": jnp.zeros((), jnp.int32),
            "next_pos": jnp.zeros((batch,), jnp.int32)}


def positions_from_segments(segment_ids: jax.Array) -> jax.Array:
    """Index of each token inside its segment: restarts at 0 wherever segment_ids changes."""
    length = segment_ids.shape[1]
    index = jnp.broadcast_to(jnp.arange(length), segment_ids.shape)
    changed = jnp.concatenate([jnp.ones_like(segment_ids[:, :1], bool), segment_ids[:, 1:] != segment_ids[:, :-1]], 1)
    segment_start = jax.lax.cummax(jnp.where(changed, index, 0), axis=1)
    return index - segment_start


def forward(params: Params, cfg: DecoderConfig, tokens: jax.Array, *, positions: jax.Array | None = None,
            attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
            cache: dict | None = None, return_hidden: bool = False, remat: bool | str = False,
            cache_window: int | None = None, max_segments: int | None = None, batch_invariant: bool = False,
            routing: Routing | jax.Array | None = None, return_routing: bool = False, lora: GroupedLora | None = None):
    """Run the decoder on tokens [B, T] -> (logits [B, T, V] float32 | final hidden [B, T, D], new_cache),
    or with ``return_routing`` a ``RoutedForward`` (out, new_cache, routing: ``models.moe.Routing``).

    Without a cache: causal attention within the row, restricted to equal non-zero
    ``segment_ids`` (``attention_mask`` is the one-segment case). With a cache: the
    tokens are written at slots cache["end"] .. +T-1 (T = prompt length for a prefill,
    1 for a decode step) and attend to every earlier real slot; ``attention_mask``
    marks left padding in a prefill. ``new_cache`` is None when ``cache`` is None.
    ``remat`` ("off", "dots", "full"; True = "full"): what each layer keeps for the backward pass
    and what it recomputes (``models.remat``; less memory for training).
    ``cache_window`` (with a cache; slots): attention reads only the filled prefix of the
    cache, rounded up to whole windows, instead of all max_len slots (same result; the
    cost of a decode step then grows with the filled length; `windowed_cache_attention`).
    ``max_segments`` (no cache; static): rows hold segments 1..K (K <= max_segments) back to back
    from slot 0 with padding after them, as the learner's packed rows do. Given, cuDNN attention
    (NVIDIA GPUs, bf16/fp16) reads the segments' spans instead of a dense mask
    (``models.fused_attention.SegmentSpans``); elsewhere it changes nothing.
    ``batch_invariant``: `models.batch_invariant`'s ops; each row's result is then bitwise independent
    of the batch and of cached vs full computation. With a cache, each token then sits at
    slot = its position (prompts right-padded; no ``cache_window``).
    Mixture-of-experts configs (``models.moe``): ``return_routing`` also returns each token's experts
    and router logits in every layer; ``routing`` (experts [B, T, nL, k] int32, or a Routing) replays
    them: the experts are fixed, the gates come from the current router. Both work with and without a cache.
    ``lora`` (no cache, not batch-invariant): several LoRA adapters applied unmerged, one per group of rows.
    """
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [batch, time], got shape {tokens.shape}")
    if cache_window is not None and cache_window <= 0:
        raise ValueError(f"cache_window must be a positive number of slots or None, got {cache_window}")
    batch, length = tokens.shape
    remat_mode(remat)  # a bad name fails here, not inside a trace
    if lora is not None and (cache is not None or batch_invariant):
        raise ValueError("lora (grouped adapters) needs the cache-free, non-batch-invariant forward")
    if cache is not None:
        return _forward_cached(params, cfg, tokens, positions, attention_mask, segment_ids, cache, return_hidden,
                               cache_window, batch_invariant, routing, return_routing)
    if segment_ids is None:
        segment_ids = jnp.ones((batch, length), jnp.int32) if attention_mask is None else attention_mask
        segment_ids = segment_ids.astype(jnp.int32)
    elif attention_mask is not None:
        raise ValueError("pass either attention_mask or segment_ids, not both")
    if positions is None:  # right- or left-padded rows both get 0, 1, ... on their real tokens
        positions = positions_from_segments(segment_ids)
    causal = jnp.tril(jnp.ones((length, length), bool))
    same_segment = segment_ids[:, :, None] == segment_ids[:, None, :]
    visible = causal[None] & same_segment & (segment_ids[:, None, :] != 0)
    if max_segments is not None and not batch_invariant and use_cudnn_attention(jnp_dtype(cfg.compute_dtype), cfg.head_dim) \
            and use_cudnn_segments():
        visible = segment_spans(segment_ids, visible, max_segments)
    unroll = unroll_layer_loop(cfg, target_platform(), remat_mode(remat))
    result = Decoder(cfg, remat=remat, unroll_layers=unroll, batch_invariant=batch_invariant,
                     lora_rows=None if lora is None else tuple(lora.rows)).apply(
        {"params": params}, tokens, positions, visible, return_hidden=return_hidden, routing=routing,
        return_routing=return_routing, lora=None if lora is None else tuple(lora.factors))
    return RoutedForward(result[0], None, result[2]) if return_routing else (result[0], None)


def unroll_layer_loop(cfg: DecoderConfig, backend: str, remat: str) -> bool:
    """Whether the cache-free forward (the learner's) unrolls its loop over layers: in bfloat16 on
    XLA:CPU without remat. There (jaxlib 0.10) the looped backward writes each layer's bf16 weight
    gradients into the stacked [nL, ...] buffers by a dynamic-update-slice that XLA:CPU computes in float32,
    converting the whole stack to float32 and back in every iteration (about half of a SmolLM2-135M
    4x128 step, ``benchmarks.cpu.op_profile --dtype bfloat16``); unrolled, the stacks are assembled once.
    float32 has no such conversion, so it keeps the loop (which compiles faster). With remat the
    loop stays: unrolled, XLA:CPU's buffer assignment keeps the activations anyway, so remat would
    save no memory. Measurements in docs/benchmarks.md (CPU learner)."""
    return backend == "cpu" and jnp_dtype(cfg.compute_dtype) == jnp.bfloat16 and remat == "off"


def _concrete_int(x) -> int | None:
    try:
        return int(x)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerIntegerConversionError):
        return None


def _forward_cached(params, cfg, tokens, positions, attention_mask, segment_ids, cache, return_hidden,
                    cache_window=None, batch_invariant=False, routing=None, return_routing=False):
    if segment_ids is not None:
        raise ValueError("segment_ids (packing) cannot be combined with a KV cache; use attention_mask")
    batch, length = tokens.shape
    max_len = cache["mask"].shape[1]
    if cache["mask"].shape[0] != batch:
        raise ValueError(f"cache holds {cache['mask'].shape[0]} rows but tokens have batch {batch}")
    filled = _concrete_int(cache["end"])
    if filled is not None and filled + length > max_len:  # under jit this cannot be checked
        raise ValueError(f"cache overflow: {filled} slots filled + {length} new tokens > max_len {max_len}")
    mask = jnp.ones((batch, length), bool) if attention_mask is None else attention_mask.astype(bool)
    if positions is None:  # each real token continues its row's count; padding gets a dummy 0
        positions = cache["next_pos"][:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
        positions = jnp.where(mask, positions, 0)
    end = cache["end"]
    slot_mask = jax.lax.dynamic_update_slice(cache["mask"], mask, (0, end))
    query_slot = end + jnp.arange(length)
    causal = jnp.arange(max_len)[None, :] <= query_slot[:, None]  # [T, S]
    visible = causal[None] & slot_mask[:, None, :]
    write_at = end
    if batch_invariant:
        write_at, slot_mask, visible = invariant.cache_slots(cache["mask"], mask, positions)
    kv = {"k": cache["k"], "v": cache["v"]}
    decoder = Decoder(cfg, cache_window=None if batch_invariant else cache_window, batch_invariant=batch_invariant)
    result = decoder.apply({"params": params}, tokens, positions, visible, kv, write_at,
                           return_hidden=return_hidden, routing=routing, return_routing=return_routing)
    kv = result[1]
    new_cache = {"k": kv["k"], "v": kv["v"], "mask": slot_mask, "end": end + length,
                 "next_pos": cache["next_pos"] + jnp.sum(mask, axis=1, dtype=jnp.int32)}
    return RoutedForward(result[0], new_cache, result[2]) if return_routing else (result[0], new_cache)
