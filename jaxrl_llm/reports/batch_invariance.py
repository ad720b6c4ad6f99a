"""Probe: which op of the decoder's forward pass gives a row a result that depends on its batch.

Each op (embedding, RMSNorm, the q/k/v/o projections, RoPE, attention, the MLP, the LM head,
the log-softmax) runs on random inputs of the model's shapes in two comparisons:

* batch: row 0 computed alone ([1, T]) and as the first of 64 rows ([64, T]);
* layout: one token computed as a decode step ([1, 1] rows; attention: one query over a
  KV cache laid out as the sampler lays it out) and inside a full forward ([1, T]; attention:
  the learner's causal attention over the sequence).

For each it prints the largest |difference| of the row's outputs and whether they are bitwise
equal, for the default ops and for the batch-invariant ones (`jaxrl_llm.models.batch_invariant`),
and names the first op that differs. Run: ``python -m jaxrl_llm.reports.batch_invariance``
(``--dtype float32 bfloat16``, ``--tokens T``).

The probe runs copies of the ops on random inputs. `first_differing_model_op` checks the model's own
ops instead: it records every op's output inside the invariant forward (flax ``sow``) for real
sequences, rows together vs each alone and decoded over the cache vs in one forward, and names the
first op that differs (what the equality tests print when they fail).
"""
from __future__ import annotations

import argparse
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import batch_invariant as inv
from jaxrl_llm.models.attention import causal_attention, grouped_attention
from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.decoder import (Decoder, apply_rope, init_cache, jnp_dtype, lm_head_logits, rms_norm,
                                      rope_inverse_frequencies)
from jaxrl_llm.models.matmul import project

BATCH = 64


class Comparison(NamedTuple):
    max_abs_diff: float
    bitwise: bool


class OpResult(NamedTuple):
    op: str
    path: str  # "default" | "invariant"
    batch: Comparison
    layout: Comparison


def smollm2_shapes() -> DecoderConfig:
    """SmolLM2-135M's config (shapes only: the probe's inputs are random)."""
    return DecoderConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
                         num_kv_heads=3, head_dim=64, max_position_embeddings=8192, rope_theta=100000.0,
                         rms_norm_eps=1e-5, tie_word_embeddings=True)


def _compare(a, b) -> Comparison:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return Comparison(float(np.max(np.abs(a - b))), bool(np.array_equal(a, b)))


def _token_ops(cfg: DecoderConfig, dtype, rng: np.random.RandomState) -> dict[str, tuple]:
    """name -> (default fn, invariant fn, weights, input width); fn(x [B, T, width], start, *weights)
    -> [B, T, ...] for tokens at positions start, start + 1, ... (weights are jit arguments)."""
    d, f = cfg.hidden_size, cfg.intermediate_size
    weight = lambda *shape: jnp.asarray(rng.randn(*shape) * 0.05, dtype)
    inv_freq = rope_inverse_frequencies(cfg)

    def mlp(proj):
        return lambda x, start, wg, wu, wd: proj(jax.nn.silu(proj(x, wg)) * proj(x, wu), wd)

    def rope(invariant):
        def fn(x, start):
            heads = x.reshape(x.shape[:-1] + (cfg.num_heads, cfg.head_dim))
            positions = jnp.broadcast_to(start + jnp.arange(x.shape[1]), x.shape[:2])
            if invariant:
                return inv.apply_rope(heads, positions, inv_freq).reshape(x.shape)
            return apply_rope(heads, positions, inv_freq).reshape(x.shape)
        return fn

    def matmul(proj):
        return lambda x, start, w: proj(x, w)

    def learner_log_softmax(z, start):  # logprobs_from_logits: z - logsumexp(z)
        return z - jax.nn.logsumexp(z, axis=-1, keepdims=True)

    tiled = lambda op: lambda x, start, *w: inv.by_tiles(lambda rows: op(rows, start, *w), x)  # as the model runs it
    return {
        "rms_norm": (lambda x, start, w: rms_norm(x, w, cfg.rms_norm_eps),
                     tiled(lambda x, start, w: inv.rms_norm(x, w, cfg.rms_norm_eps)), (weight(d) + 1,), d),
        "q_proj": (matmul(project), tiled(matmul(project)), (weight(d, cfg.q_dim),), d),
        "k_proj": (matmul(project), tiled(matmul(project)), (weight(d, cfg.kv_dim),), d),
        "v_proj": (matmul(project), tiled(matmul(project)), (weight(d, cfg.kv_dim),), d),
        "rope": (rope(False), rope(True), (), cfg.q_dim),
        "o_proj": (matmul(project), tiled(matmul(project)), (weight(cfg.q_dim, d),), cfg.q_dim),
        "mlp": (mlp(project), tiled(mlp(project)), (weight(d, f), weight(d, f), weight(f, d)), d),
        "lm_head": (lambda x, start, e: lm_head_logits(x, {"embed": e}, cfg),
                    tiled(lambda x, start, e: jax.lax.dot_general(x, e, (((1,), (1,)), ((), ())),
                                                                  preferred_element_type=jnp.float32)),
                    (weight(cfg.vocab_size, d),), d),
        # default: the sampler's jax.nn.log_softmax for a decode step, the learner's formula in the full forward
        "log_softmax": ((lambda z, start: jax.nn.log_softmax(z), learner_log_softmax),
                        tiled(lambda z, start: inv.log_softmax(z)), (), cfg.vocab_size),
    }


def _run_token_op(fns, weights, width, dtype, tokens, rng) -> tuple[Comparison, Comparison]:
    """batch: one decode-step token of row 0 alone vs among 64 rows; layout: token t of one
    sequence as a decode step vs inside the full forward."""
    step_fn, full_fn = fns if isinstance(fns, tuple) else (fns, fns)
    x = jnp.asarray(rng.randn(BATCH, tokens, width), jnp.float32 if width > 10_000 else dtype)
    step, full = jax.jit(step_fn), jax.jit(full_fn)
    token = tokens // 2
    one = step(x[:1, token:token + 1], token, *weights)[0, 0]
    batch = _compare(one, step(x[:, token:token + 1], token, *weights)[0, 0])
    return batch, _compare(one, full(x[:1], 0, *weights)[0, token])


def _run_embedding(cfg, dtype, tokens, rng) -> tuple[Comparison, Comparison]:
    embed = jnp.asarray(rng.randn(cfg.vocab_size, cfg.hidden_size), dtype)
    ids = jnp.asarray(rng.randint(0, cfg.vocab_size, (BATCH, tokens)))
    take = jax.jit(lambda i, e: jnp.take(e, i, axis=0))
    token = tokens // 2
    one = take(ids[:1, token:token + 1], embed)[0, 0]
    return _compare(one, take(ids[:, token:token + 1], embed)[0, 0]), _compare(one, take(ids[:1], embed)[0, token])


def _run_attention(cfg, dtype, tokens, rng, invariant: bool) -> tuple[Comparison, Comparison]:
    """batch: full causal attention of row 0 alone vs among 64 rows. layout: the last query of a
    sequence as a decode step over a cache of S slots vs inside the full forward. Default path:
    the sampler's cache is left-padded (prompt ending at a bucket edge) and read by grouped_attention;
    invariant: slot = position."""
    heads, kv_heads, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = jnp.asarray(rng.randn(BATCH, tokens, heads, hd), dtype)
    k = jnp.asarray(rng.randn(BATCH, tokens, kv_heads, hd), dtype)
    v = jnp.asarray(rng.randn(BATCH, tokens, kv_heads, hd), dtype)
    causal = jnp.tril(jnp.ones((tokens, tokens), bool))
    full_fn = jax.jit(inv.attention if invariant else causal_attention)
    full = lambda b: full_fn(q[:b], k[:b], v[:b], jnp.broadcast_to(causal, (b, tokens, tokens)))
    batch = _compare(full(1)[0], full(BATCH)[0])
    slots = tokens + 37  # the cache reserves room for more tokens than the sequence has
    offset = 0 if invariant else 11  # left padding before the prompt in the sampler's layout
    cache_k = jnp.zeros((1, slots + offset, kv_heads, hd), dtype).at[:, offset:offset + tokens].set(k[:1])
    cache_v = jnp.zeros((1, slots + offset, kv_heads, hd), dtype).at[:, offset:offset + tokens].set(v[:1])
    visible = (jnp.arange(slots + offset) >= offset) & (jnp.arange(slots + offset) < offset + tokens)
    step_fn = jax.jit(inv.attention if invariant else grouped_attention)
    step = step_fn(q[:1, -1:], cache_k, cache_v, visible[None, None, :])
    return batch, _compare(step[0, 0], full(1)[0, -1])


def probe(dtype_name: str, tokens: int = 48, seed: int = 0, cfg: DecoderConfig | None = None) -> list[OpResult]:
    """Every op, default and invariant, at ``dtype_name`` (compute dtype; logits float32)."""
    cfg = (smollm2_shapes() if cfg is None else cfg).with_dtypes(param_dtype=dtype_name, compute_dtype=dtype_name)
    dtype = jnp_dtype(dtype_name)
    rng = np.random.RandomState(seed)
    results = [OpResult("embedding", path, *_run_embedding(cfg, dtype, tokens, rng))
               for path in ("default", "invariant")]
    for name, (default, invariant, weights, width) in _token_ops(cfg, dtype, rng).items():
        for path, fns in (("default", default), ("invariant", invariant)):
            results.append(OpResult(name, path, *_run_token_op(fns, weights, width, dtype, tokens, rng)))
        if name == "rope":  # attention follows rope in the forward pass
            for path in ("default", "invariant"):
                results.append(OpResult("attention", path,
                                        *_run_attention(cfg, dtype, tokens, rng, path == "invariant")))
    return results


def first_differing(results: list[OpResult], path: str) -> str | None:
    for result in results:
        if result.path == path and not (result.batch.bitwise and result.layout.bitwise):
            return result.op
    return None


class ModelOpDifference(NamedTuple):
    """The first op of the model's own forward pass whose output for some row differs."""
    op: str  # "layer L <op>" (`batch_invariant.block`'s ops), "final_norm" or "logprobs"
    comparison: str  # "batch": rows together vs each alone; "layout": decode over the cache vs full forward
    max_abs_diff: float
    differing: int  # outputs (tokens x features) that differ

    def __str__(self) -> str:
        return f"{self.op} ({self.comparison}: {self.differing} values differ, max |d| {self.max_abs_diff:.3e})"


@functools.partial(jax.jit, static_argnames="cfg")
def _recorded_forward(params, cfg: DecoderConfig, tokens, positions, visible, kv=None, write_at=None):
    """The invariant forward with every op's output recorded: (hidden, kv, intermediates)."""
    (hidden, kv), state = Decoder(cfg, batch_invariant=True).apply(
        {"params": params}, tokens, positions, visible, kv, write_at, return_hidden=True, mutable=["intermediates"])
    return hidden, kv, state["intermediates"]


# one compiled program per shape for every call (a jax.jit made inside each call would trace again)
_token_logprobs = jax.jit(lambda *a: inv.token_logprobs(*a), static_argnums=3)
_head_logprobs = jax.jit(lambda *a: inv.head_logprobs(*a), static_argnums=2)


def _ops_in_order(cfg: DecoderConfig, recorded: dict) -> list[tuple[str, jax.Array]]:
    """[(op, output [B, T, ...])] in forward order: each layer's ops, then the final norm."""
    layers = recorded["layers"]
    ops = [(f"layer {i} {name}", layers[name][0][i]) for i in range(cfg.num_layers) for name in inv.BLOCK_OPS
           if name in layers]
    return ops + [("final_norm", recorded["final_norm"][0])]


def _full_forward_ops(params, cfg, tokens: np.ndarray, lengths: np.ndarray, temperature: float):
    """Right-padded rows [B, T] in one learner forward -> [(op, [B, T, ...])], the last the log-prob of
    each next token."""
    batch, width = tokens.shape
    mask = np.arange(width)[None, :] < lengths[:, None]
    visible = np.tril(np.ones((width, width), bool))[None] & mask[:, None, :]
    positions = np.broadcast_to(np.arange(width), tokens.shape)
    hidden, _, recorded = _recorded_forward(params, cfg, tokens, positions, visible)
    ops = _ops_in_order(cfg, recorded)
    weight = params["embed" if cfg.tie_word_embeddings else "lm_head"]
    targets = np.concatenate([tokens[:, 1:], np.zeros((batch, 1), tokens.dtype)], axis=1)
    logp = _token_logprobs(hidden, targets, weight, cfg.tie_word_embeddings, temperature)
    return ops + [("logprobs", logp[..., None])]


def _decoded_ops(params, cfg, tokens: np.ndarray, length: int, prompt: int, temperature: float):
    """One row as the sampler computes it: its prompt prefilled into the cache (slot = position), then
    one token per decode step -> [(op, [1, T, ...])] over its ``length`` tokens."""
    width = tokens.shape[0]
    kv = {name: x for name, x in init_cache(cfg, 1, width).items() if name in ("k", "v")}
    slot_mask = jnp.zeros((1, width), bool)
    weight = params["embed" if cfg.tie_word_embeddings else "lm_head"]
    chunks = []
    for start, stop in [(0, prompt)] + [(t, t + 1) for t in range(prompt, length)]:
        positions = np.arange(start, stop)[None]
        write_at, slot_mask, visible = inv.cache_slots(slot_mask, np.ones_like(positions, bool), positions)
        hidden, kv, recorded = _recorded_forward(params, cfg, tokens[None, start:stop], positions, visible, kv, write_at)
        ops = _ops_in_order(cfg, recorded)
        logp = _head_logprobs(hidden[0], weight, cfg.tie_word_embeddings, temperature)
        nxt = np.append(tokens[start + 1:stop + 1], 0)[:stop - start]
        chunks.append(ops + [("logprobs", jnp.take_along_axis(logp, nxt[:, None], axis=-1)[None])])
    return [(op, jnp.concatenate([c[i][1] for c in chunks], axis=1)) for i, (op, _) in enumerate(chunks[0])]


def _first_difference(a, b, lengths: np.ndarray, comparison: str) -> ModelOpDifference | None:
    """First op whose outputs differ on the rows' real tokens (a, b: [(op, [B, T, ...])])."""
    valid = np.arange(np.asarray(a[0][1]).shape[1])[None, :] < lengths[:, None]
    for (op, x), (_, y) in zip(a, b):
        x, y = np.asarray(x, np.float64)[valid], np.asarray(y, np.float64)[valid]
        if op == "logprobs":  # the last token of a row predicts nothing
            keep = (np.arange(valid.shape[1])[None, :] < lengths[:, None] - 1)[valid]
            x, y = x[keep], y[keep]
        if not np.array_equal(x, y):
            return ModelOpDifference(op, comparison, float(np.max(np.abs(x - y))), int(np.sum(x != y)))
    return None


def first_differing_model_op(params, cfg: DecoderConfig, sequences: list[list[int]], prompt_lengths: list[int],
                             temperature: float = 1.0) -> ModelOpDifference | None:
    """Find the op, in the model itself (not the probe's copies of its ops), whose output for a row
    depends on its batch or on how its tokens were computed: the sequences' ops in one learner
    forward (all rows together) vs each row alone ("batch"), then each row decoded token by token
    over the KV cache after its prompt vs its full forward ("layout"). None when every op agrees."""
    lengths = np.array([len(s) for s in sequences])
    width = int(lengths.max())
    tokens = np.zeros((len(sequences), width), np.int32)
    for row, seq in enumerate(sequences):
        tokens[row, :len(seq)] = seq
    together = _full_forward_ops(params, cfg, tokens, lengths, temperature)
    alone = [_full_forward_ops(params, cfg, tokens[row:row + 1], lengths[row:row + 1], temperature)
             for row in range(len(sequences))]
    stacked = [(op, jnp.concatenate([rows[i][1] for rows in alone])) for i, (op, _) in enumerate(alone[0])]
    found = _first_difference(together, stacked, lengths, "batch")
    for row in range(len(sequences)):
        if found is not None:
            return found
        decoded = _decoded_ops(params, cfg, tokens[row], int(lengths[row]), prompt_lengths[row], temperature)
        found = _first_difference(decoded, [(op, x[:, :lengths[row]]) for op, x in alone[row]],
                                  lengths[row:row + 1], "layout")
    return found


def format_results(dtype_name: str, results: list[OpResult]) -> str:
    lines = [f"{dtype_name}: batch = a decode step of row 0 alone vs among {BATCH} rows (attention: full causal, "
             f"[1, T] vs [{BATCH}, T]); layout = a token as a decode step vs inside the full forward of its sequence",
             f"  {'op':<12} {'path':<10} {'batch max|d|':>13} {'equal':>6} {'layout max|d|':>14} {'equal':>6}"]
    for r in results:
        lines.append(f"  {r.op:<12} {r.path:<10} {r.batch.max_abs_diff:>13.3e} {str(r.batch.bitwise):>6} "
                     f"{r.layout.max_abs_diff:>14.3e} {str(r.layout.bitwise):>6}")
    for path in ("default", "invariant"):
        lines.append(f"  first op that differs ({path}): {first_differing(results, path) or 'none'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    parser.add_argument("--tokens", type=int, default=48)
    args = parser.parse_args(argv)
    print(f"backend {jax.default_backend()}, jax {jax.__version__}, SmolLM2-135M shapes, T = {args.tokens}")
    for dtype_name in args.dtype:
        print(format_results(dtype_name, probe(dtype_name, args.tokens)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
