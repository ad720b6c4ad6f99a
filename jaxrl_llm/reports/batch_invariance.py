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
"""
from __future__ import annotations

import argparse
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import batch_invariant as inv
from jaxrl_llm.models.attention import causal_attention, grouped_attention
from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.decoder import apply_rope, jnp_dtype, lm_head_logits, rms_norm, rope_inverse_frequencies
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
