"""Batch-invariant versions of the decoder's reductions: a row's result does not depend on the other
rows, its index, the padding, or whether its tokens are computed one at a time (decode over a KV
cache) or all at once (the learner's forward).

What XLA:CPU (jaxlib 0.10) does otherwise, measured by ``python -m jaxrl_llm.reports.batch_invariance``:

* a dot's kernel, and so its summation order over the contracted axis, depends on the number of
  rows M (float32: M = 1, 2..16 and >= 33 round differently; bf16: M = 1 against M >= 2);
* a reduction (``jnp.sum``/``mean``/``logsumexp``) splits its axis by the shape of the whole
  array: the same row summed alone or among 2, 3 or 64 rows can differ in the last bit, and a
  run of zeros before or after the values changes the result.

The fixes, one mechanism each:

* `tree_sum`: the sum over an axis as a binary tree of elementwise adds (first half + second
  half), the axis zero-padded to a power of two. Elementwise IEEE adds round the same at any shape, and
  an appended zero is only ever added to a value or to another zero (exact), so the sum of a row is a function of that
  row's values and their order alone, whatever the array's shape or the padding after them.
* `by_tiles`: every per-token op (projections, RMSNorm, RoPE, MLP, LM head) on tiles of TILE rows
  (zero-padded), one program of one fixed shape per tile in a ``lax.map``: every row goes through
  the same dot kernel and the same elementwise code (a vmap would not do it: XLA folds the batch
  back into one op of any M).
* `attention`: query rows in the same tiles, keys in blocks of KEY_BLOCK at slot = position (in the
  cache and in the learner's rows); each block's scores q.k and weighted values are dots of one
  fixed shape, and the blocks are folded in order with a running max (online softmax) up to the
  tile's last visible key, so a decode step over its cache and the learner's full forward fold the
  same numbers in the same order (a block past a row's last key changes nothing, exactly);
* `log_softmax`: (z - max) - log(tree_sum(exp(z - max))), the one formula the sampler and the
  learner both use.
* mixture-of-experts blocks (``models.moe.moe_mlp``: the router's matmul, softmax and top-k, the
  experts' einsums) run in the same tiles as the dense MLP: every contraction is then a dot of one
  fixed shape ([TILE, D] by [D, E], [TILE, D] by [E, D, F], ...), so a token's router logits, its
  experts and the experts' output do not depend on its batch either (a token's experts, the one
  discrete choice, are then the learner's too).

Same idea as the batch-invariant kernels of He & Thinking Machines (2025, "Defeating
Nondeterminism in LLM Inference") for GPUs: fix each reduction's order per row.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import matmul
from jaxrl_llm.models.moe import LayerRouting, moe_mlp, moe_param_shapes

TILE = 32  # rows per tile (`by_tiles`)
# the ops `block` records (``record=True``), in the order they run
BLOCK_OPS = ("input_norm", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "rope_q", "rope_k", "attention", "o_proj",
             "post_norm", "mlp")
KEY_BLOCK = 64  # keys per block of `attention`


def _map(fn, xs):
    """``lax.map`` over the leading axis, which must be >= 2: XLA inlines a loop of one
    iteration into the code around it, where it may be fused (and rounded) differently."""
    return jax.lax.map(fn, xs)


def _tiles(count: int, size: int) -> int:
    return max(2, -(-count // size))


def tree_sum(x: jax.Array, axis: int = -1) -> jax.Array:
    """Sum over ``axis`` as a binary tree (the axis zero-padded to a power of two, then its first half
    added to its second, elementwise, until one element is left): the result for each output element
    depends only on the values along the axis, in order, and is unchanged by zeros appended after
    them. (Halves, not adjacent pairs: contiguous slices, ~3x faster on a [32, 49152] log-softmax.)"""
    axis = axis % x.ndim
    length = x.shape[axis]
    size = 1 << max(0, (length - 1).bit_length())
    if size != length:
        pad = [(0, 0)] * x.ndim
        pad[axis] = (0, size - length)
        x = jnp.pad(x, pad)
    while x.shape[axis] > 1:
        half = x.shape[axis] // 2
        x = jax.lax.slice_in_dim(x, 0, half, axis=axis) + jax.lax.slice_in_dim(x, half, 2 * half, axis=axis)
    return jax.lax.index_in_dim(x, 0, axis, keepdims=False)


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """``decoder.rms_norm`` with the mean of squares by `tree_sum`."""
    x32 = x.astype(jnp.float32)
    mean_square = tree_sum(x32 * x32, -1)[..., None] / x.shape[-1]
    normed = x32 * jax.lax.rsqrt(mean_square + eps)
    return normed.astype(x.dtype) * weight.astype(x.dtype)


def by_tiles(fn, *arrays: jax.Array, lead: int = 2):
    """fn applied to fixed tiles of TILE rows (the first ``lead`` axes flattened into rows,
    zero-padded), in a ``lax.map``: every row goes through one program of one shape, so no
    shape-dependent code generation (vector body vs remainder, FMA contraction) changes a row."""
    shape = arrays[0].shape[:lead]
    count = int(np.prod(shape))
    tiles = _tiles(count, TILE)

    def split(x):
        x = x.reshape((count,) + x.shape[lead:])
        x = jnp.pad(x, [(0, tiles * TILE - count)] + [(0, 0)] * (x.ndim - 1))
        return x.reshape((tiles, TILE) + x.shape[1:])

    out = _map(lambda xs: fn(*xs), tuple(split(x) for x in arrays))
    return jax.tree_util.tree_map(lambda y: y.reshape((tiles * TILE,) + y.shape[2:])[:count].reshape(
        shape + y.shape[2:]), out)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq) -> jax.Array:
    """``decoder.apply_rope`` of x [B, T, H, hd] by `by_tiles`: XLA:CPU rounds the same rotation
    differently in a [1, 1] and a [64, 1] array (the probe: 2.4e-7 in float32)."""
    return by_tiles(lambda x, pos: _rotate(x, pos, inv_freq), x, positions)


def log_softmax(z: jax.Array) -> jax.Array:
    """float32 log-softmax over the last axis with the normaliser summed by `tree_sum`."""
    z = z.astype(jnp.float32)
    shifted = z - jax.lax.stop_gradient(jnp.max(z, axis=-1, keepdims=True))
    return shifted - jnp.log(tree_sum(jnp.exp(shifted), -1))[..., None]


def _key_blocks(visible: jax.Array) -> jax.Array:
    """How many key blocks a tile of query rows needs: up to the block of its last visible key
    (visible [TILE, S]; 0 when no key is visible). Later blocks are all masked for every row."""
    last = jnp.max(jnp.where(visible, jnp.arange(visible.shape[-1]), -1))
    return (last + KEY_BLOCK) // KEY_BLOCK


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, rows: jax.Array, visible: jax.Array) -> jax.Array:
    """One tile of query rows: q [TILE, Hkv, G, hd]; k/v [B, S, Hkv, hd] the whole batch's keys,
    of which query row i sees row ``rows[i]``; visible [TILE, S] -> [TILE, Hkv, G, hd] float32.

    Keys go in blocks of KEY_BLOCK through one loop whose body has one fixed shape, so every score
    q.k, exp and weighted sum is computed by the same code (the same dot kernel: batch (TILE, Hkv),
    M = G) whatever S or the batch is. The loop runs over the blocks up to the tile's last visible key
    (`_key_blocks`) with a running max (the online softmax of Milakov & Gimelshein 2018, as in flash
    attention): a block past a row's last visible key leaves its max unchanged, so its sums are
    multiplied by exp(0) = 1 and added exact zeros; a decode step over its cache and the learner's full
    forward then fold the same numbers in the same order."""
    scale = q.shape[-1] ** -0.5

    def add_block(i, carry):
        top, total, out = carry
        slots = i * KEY_BLOCK + jnp.arange(KEY_BLOCK)  # past S (the last block): zeros, not visible
        key, value = (x.at[rows[:, None], slots[None, :]].get(mode="fill", fill_value=0) for x in (k, v))
        see = visible.at[:, slots].get(mode="fill", fill_value=False)[:, None, None, :]
        scores = jnp.einsum("tkgd,tskd->tkgs", q, key, preferred_element_type=jnp.float32) * scale
        new_top = jnp.maximum(top, jnp.max(jnp.where(see, scores, -jnp.inf), axis=-1))
        finite = jnp.where(jnp.isfinite(new_top), new_top, 0.0)  # rows with no visible key yet
        rescale = jnp.where(jnp.isfinite(top), jnp.exp(top - finite), 0.0)
        weights = jnp.where(see, jnp.exp(scores - finite[..., None]), 0.0)
        weighted = jnp.einsum("tkgs,tskd->tkgd", weights, value, preferred_element_type=jnp.float32)
        return new_top, total * rescale + tree_sum(weights, -1), out * rescale[..., None] + weighted

    start = (jnp.full(q.shape[:3], -jnp.inf, jnp.float32), jnp.zeros(q.shape[:3], jnp.float32),
             jnp.zeros(q.shape, jnp.float32))
    _, total, out = jax.lax.fori_loop(0, _key_blocks(visible), add_block, start)
    return out / jnp.where(total > 0, total, 1.0)[..., None]


def attention(q: jax.Array, k: jax.Array, v: jax.Array, visible: jax.Array) -> jax.Array:
    """softmax(q k^T / sqrt(hd)) v with KV-head sharing, in float32, TILE query rows at a time
    (`by_tiles`; each row with its own row's keys), key blocks by `_attend`.

    q [B, T, Hq, hd], k/v [B, S, Hkv, hd], visible [B, T, S] -> [B, T, Hq, hd] in q's dtype.
    Keys must sit at slot = position for the result to match between a decode step and the
    full forward (masked slots after the visible ones add exact zeros). A query with no visible
    key gets zeros."""
    batch, length, heads, head_dim = q.shape
    kv_heads = k.shape[2]
    q32 = q.astype(jnp.float32).reshape(batch, length, kv_heads, heads // kv_heads, head_dim)
    k32, v32 = k.astype(jnp.float32), v.astype(jnp.float32)
    row = jnp.broadcast_to(jnp.arange(batch)[:, None], (batch, length))
    out = by_tiles(lambda q, r, vis: _attend(q, k32, v32, r, vis), q32, row, visible)
    return out.reshape(batch, length, heads, head_dim).astype(q.dtype)


def _rotate(x: jax.Array, positions: jax.Array, inv_freq) -> jax.Array:
    """RoPE of one tile x [TILE, H, hd] at positions [TILE] (``decoder.apply_rope``'s formula)."""
    angles = positions.astype(jnp.float32)[:, None] * jnp.asarray(inv_freq)[None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, None, :]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    return (x32 * jnp.cos(angles) + jnp.concatenate([-x2, x1], axis=-1) * jnp.sin(angles)).astype(x.dtype)


def block(w: dict, cfg, hidden: jax.Array, kv: dict | None, layer_index, positions: jax.Array,
          visible: jax.Array, slots: jax.Array | None, inv_freq, record: bool = False,
          replay: jax.Array | None = None) -> tuple[jax.Array, dict | None, dict, LayerRouting | None]:
    """One decoder block (``decoder.DecoderLayer``'s math) with every per-token part in `by_tiles`
    and the attention of `attention`. w: the layer's params by name; hidden [B, T, D];
    kv: the whole cache {"k", "v": [nL, B, S, Hkv, hd]} or None; slots [B, T]: the cache slot of
    each token (= its position; S for padding, which is dropped). Returns (hidden, kv, ops, routing):
    with ``record``, ops holds each op's output [B, T, ...] by name (`BLOCK_OPS`;
    what ``reports.batch_invariance.first_differing_model_op`` compares), else {}; routing: a MoE
    config's `LayerRouting` [B, T, ...] (``replay`` [B, T, k]: these experts, ``models.moe``), else None."""
    heads, kv_heads, hd, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    batch, length, _ = hidden.shape

    def linear(x, name):
        out = matmul.project(x, w[name].astype(x.dtype))
        return out + w[name.replace("_proj", "_bias")].astype(x.dtype) if name.replace("_proj", "_bias") in w else out

    def before_attention(h, pos):  # h [TILE, D], pos [TILE]
        x = rms_norm(h, w["input_norm"], eps)
        q = linear(x, "q_proj").reshape(TILE, heads, hd)
        k = linear(x, "k_proj").reshape(TILE, kv_heads, hd)
        v = linear(x, "v_proj").reshape(TILE, kv_heads, hd)
        ops = {"input_norm": x, "q_proj": q, "k_proj": k, "v_proj": v}
        if "q_norm" in w:
            q, k = rms_norm(q, w["q_norm"], eps), rms_norm(k, w["k_norm"], eps)
            ops |= {"q_norm": q, "k_norm": k}
        q, k = _rotate(q, pos, inv_freq), _rotate(k, pos, inv_freq)
        return (q, k, v), (ops | {"rope_q": q, "rope_k": k} if record else {})

    (q, k, v), ops = by_tiles(before_attention, hidden, positions)
    if kv is not None:  # write at slot = position, then attend over the layer's whole cache row
        rows = jnp.arange(batch)[:, None]
        kv = {name: kv[name].at[layer_index, rows, slots].set(x.astype(kv[name].dtype), mode="drop")
              for name, x in (("k", k), ("v", v))}
        k, v = (jax.lax.dynamic_index_in_dim(kv[name], layer_index, keepdims=False).astype(q.dtype)
                for name in ("k", "v"))
    attended = attention(q, k, v, visible)

    def after_attention(h, a, *chosen):  # h [TILE, D], a [TILE, Hq, hd]; chosen: the tile's replay [TILE, k]
        h = h + linear(a.reshape(TILE, heads * hd), "o_proj")
        x = rms_norm(h, w["post_norm"], eps)
        routing = None
        if cfg.is_moe:
            replay = chosen[0] if chosen else None  # the dense form: ragged rows depend on the batch's routing
            mlp, routing = moe_mlp(x, w, cfg.num_experts_per_tok, cfg.norm_topk_prob, replay, form="dense")
        else:
            mlp = linear(jax.nn.silu(linear(x, "gate_proj")) * linear(x, "up_proj"), "down_proj")
        out = h + mlp
        return out, routing, ({"o_proj": h, "post_norm": x, "mlp": out} if record else {})

    hidden, routing, after = by_tiles(after_attention, hidden, attended, *(() if replay is None else (replay,)))
    return hidden, kv, (ops | {"attention": attended} | after if record else {}), routing


def final_norm(hidden: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    return by_tiles(lambda h: rms_norm(h, weight, eps), hidden, lead=hidden.ndim - 1)


def _tile_logprobs(h: jax.Array, weight: jax.Array, tied: bool, temperature) -> jax.Array:
    """log-softmax [TILE, V] of one tile's logits (h [TILE, D] @ W) / temperature, float32."""
    logits = jax.lax.dot_general(h, weight.astype(h.dtype), (((1,), (1 if tied else 0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    # times 1 / T, not / T: XLA rewrites a division by a constant (the learner's T) into a
    # multiplication by its reciprocal, and the sampler's T is not a constant.
    return log_softmax(logits * (1.0 / temperature))


def head_logprobs(hidden: jax.Array, weight: jax.Array, tied: bool, temperature) -> jax.Array:
    """The sampler's: log pi(. | row) [B, V] for final hidden rows [B, D] (W: embed [V, D] if
    ``tied``, else lm_head [D, V]), by tiles of TILE rows."""
    temperature = jnp.asarray(temperature, jnp.float32)
    return by_tiles(lambda h: _tile_logprobs(h, weight, tied, temperature), hidden, lead=1)


def token_logprobs(hidden: jax.Array, targets: jax.Array, weight: jax.Array, tied: bool, temperature,
                   return_entropy: bool = False):
    """The learner's: log pi(target) [B, N] (and the entropy) for hidden [B, N, D], from the same
    per-tile log-softmax as `head_logprobs`, so each equals the sampler's number bit for bit."""
    temperature = jnp.asarray(temperature, jnp.float32)

    def tile(h, y):
        logp = _tile_logprobs(h, weight, tied, temperature)
        picked = jnp.take_along_axis(logp, y[:, None].astype(jnp.int32), axis=-1)[:, 0]
        if not return_entropy:
            return picked
        return picked, -tree_sum(jnp.where(jnp.isfinite(logp), jnp.exp(logp) * logp, 0.0), -1)

    return by_tiles(tile, hidden, targets)


def layer_param_specs(cfg) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, init: "dense" | "ones" | "zeros") of one layer's params, in the order
    ``decoder.DecoderLayer`` creates them."""
    d, f, hd, q, kvd = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim, cfg.q_dim, cfg.kv_dim
    specs = [("input_norm", (d,), "ones"), ("q_proj", (d, q), "dense"), ("k_proj", (d, kvd), "dense"),
             ("v_proj", (d, kvd), "dense")]
    specs += [("q_bias", (q,), "zeros"), ("k_bias", (kvd,), "zeros"), ("v_bias", (kvd,), "zeros")] * cfg.qkv_bias
    specs += [("q_norm", (hd,), "ones"), ("k_norm", (hd,), "ones")] * cfg.qk_norm
    specs += [("o_proj", (q, d), "dense")] + [("o_bias", (d,), "zeros")] * cfg.o_bias
    specs += [("post_norm", (d,), "ones")]
    if cfg.is_moe:
        return specs + [(name, shape, "dense") for name, shape in
                        moe_param_shapes(d, cfg.num_experts, cfg.moe_intermediate_size).items()]
    return specs + [("gate_proj", (d, f), "dense"), ("up_proj", (d, f), "dense"), ("down_proj", (f, d), "dense")]


def cache_slots(cache_mask: jax.Array, mask: jax.Array, positions: jax.Array) -> tuple[jax.Array, jax.Array,
                                                                                        jax.Array]:
    """The cache layout of the batch-invariant path: each token at slot = its position.
    cache_mask [B, S], mask/positions [B, T] -> (slots [B, T] (S for padding: dropped),
    new cache_mask [B, S], visible [B, T, S]: the written slots at or before each query's position)."""
    max_len = cache_mask.shape[1]
    slots = jnp.where(mask, positions, max_len)
    new_mask = cache_mask.at[jnp.arange(mask.shape[0])[:, None], slots].set(True, mode="drop")
    visible = new_mask[:, None, :] & (jnp.arange(max_len)[None, None, :] <= positions[:, :, None])
    return slots, new_mask, visible
