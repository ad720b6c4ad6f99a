"""Per-token log-probabilities of given tokens, chunked over the sequence.

For next-token targets y_t = tokens[t+1] and final hidden states h_t:

    z_t = (h_t W_head) / temperature                      (float32)
    log pi(y_t | y_<=t) = z_t[y_t] - logsumexp(z_t)
    H_t = -sum_v p_tv log p_tv,   p_t = softmax(z_t)

The [T, V] logits are never materialised: the sequence is cut into chunks of
``chunk_size`` positions and each chunk's logits are computed, reduced and
dropped inside a ``lax.map``. Each chunk is wrapped in ``jax.checkpoint``, so
the backward pass recomputes one chunk's logits at a time instead of keeping
all of them: peak memory is O(B * chunk_size * V) forward and backward. When the
whole sequence fits in one chunk nothing is checkpointed: recomputing the only
chunk would cost a fourth LM-head matmul and lower no peak.
log-softmax always runs in float32 (Qi et al. 2025, arXiv 2510.26788: low
precision softmax is a main source of training/inference mismatch).

``fused=True`` (the default) replaces the checkpointed chunks by
``fused_chunked_logprobs``, a custom VJP written out by hand. Its forward keeps
only per-token scalars (logsumexp, entropy) besides the inputs; its backward
computes each chunk's logits once more and forms the logit cotangent directly,

    dL/dz = g (onehot(y) - p) - g_H p (log p + H),       dL/dlogits = dL/dz / temperature,

then dh = dL/dlogits @ W per chunk and dW = sum over chunks of dL/dlogits^T h
(float32). The checkpointed path instead reruns the chunk's whole forward
(logsumexp, gather, entropy) and then autodiff's backward through it; the fused
one runs 1 logits matmul forward and 1 recompute + 2 gradient matmuls backward,
with the same O(B * chunk_size * V) peak. ``fused=False`` keeps the checkpointed path.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.models import batch_invariant as invariant
from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.decoder import forward, jnp_dtype, lm_head_logits


def _check_temperature(temperature: Any) -> None:
    if isinstance(temperature, (int, float)) and not temperature > 0:
        raise ValueError(f"temperature={temperature!r} must be > 0")


def logprobs_from_logits(logits: jax.Array, targets: jax.Array, *, temperature: float = 1.0,
                         return_entropy: bool = False):
    """log softmax(logits / temperature)[targets] in float32 (+ entropy); logits [..., V], targets [...].

    The unchunked formulation; ``chunked_logprobs_from_hidden`` computes the same thing
    without holding all logits at once.
    """
    _check_temperature(temperature)
    scaled = logits.astype(jnp.float32) / temperature
    log_norm = jax.nn.logsumexp(scaled, axis=-1)
    target_logit = jnp.take_along_axis(scaled, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    logp = target_logit - log_norm
    if not return_entropy:
        return logp
    # -sum p log p with log p formed per entry: summing small terms keeps float32 error at
    # a few ulps (the equivalent logsumexp - sum p z subtracts two large numbers).
    log_probs = scaled - log_norm[..., None]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return logp, entropy


def _logits(hidden: jax.Array, weight: jax.Array, tied: bool) -> jax.Array:
    """float32 logits [..., V] from hidden [..., D] and W (tied: embed [V, D], else lm_head [D, V]), one dtype."""
    contract = 1 if tied else 0
    return jax.lax.dot_general(hidden, weight, (((hidden.ndim - 1,), (contract,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _chunk_stats(hidden, weight, temperature, targets, tied, return_entropy):
    """One chunk: scaled logits z [B, c, V], logp, logsumexp and entropy (None unless asked) [B, c]."""
    scaled = _logits(hidden, weight, tied) / temperature
    log_norm = jax.nn.logsumexp(scaled, axis=-1)
    logp = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0] - log_norm
    entropy = None
    if return_entropy:  # per-entry log p, as logprobs_from_logits
        log_probs = scaled - log_norm[..., None]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return scaled, logp, log_norm, entropy


@partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _fused_chunks(hidden, weight, temperature, targets, tied, return_entropy):
    """hidden [C, B, c, D] (compute dtype), targets [C, B, c] -> logp (, entropy) [C, B, c] float32."""
    return _fused_forward(hidden, weight, temperature, targets, tied, return_entropy)[0]


def _fused_forward(hidden, weight, temperature, targets, tied, return_entropy):
    w = weight.astype(hidden.dtype)

    def one_chunk(args):
        _, logp, log_norm, entropy = _chunk_stats(args[0], w, temperature, args[1], tied, return_entropy)
        return logp, log_norm, entropy

    logp, log_norm, entropy = jax.lax.map(one_chunk, (hidden, targets))
    out = (logp, entropy) if return_entropy else logp
    # Residuals: the inputs and per-token scalars only, never a chunk's logits.
    return out, (hidden, weight, temperature, targets, log_norm, entropy)


def _fused_backward(tied, return_entropy, residuals, cotangent):
    hidden, weight, temperature, targets, log_norm, entropy = residuals
    g_logp, g_entropy = cotangent if return_entropy else (cotangent, None)
    w = weight.astype(hidden.dtype)

    def one_chunk(carry, args):
        dweight, dtemperature = carry
        h, y, lse, g = args[:4]
        scaled = _logits(h, w, tied) / temperature  # the one recompute
        log_probs = scaled - lse[..., None]
        probs = jnp.exp(log_probs)
        onehot = jax.lax.broadcasted_iota(jnp.int32, scaled.shape, scaled.ndim - 1) == y[..., None]
        dscaled = g[..., None] * (onehot.astype(jnp.float32) - probs)
        if return_entropy:  # dH/dz = -p (log p + H)
            ent, g_ent = args[4:]
            dscaled = dscaled - g_ent[..., None] * probs * (log_probs + ent[..., None])
        dtemperature = dtemperature - jnp.sum(dscaled * scaled) / temperature  # z = logits / T
        dlogits = (dscaled / temperature).astype(h.dtype)
        dh = jax.lax.dot_general(dlogits, w, (((dlogits.ndim - 1,), (0 if tied else 1,)), ((), ())),
                                 preferred_element_type=jnp.float32).astype(h.dtype)
        rows = tuple(range(h.ndim - 1))
        # h^T @ dlogits [D, V] for both heads: the tied [V, D] = dlogits^T @ h would copy a transposed
        # [B * c, V] dlogits per chunk on XLA:CPU; the [D, V] sum is transposed once at the end instead.
        dweight = dweight + jax.lax.dot_general(h, dlogits, ((rows, rows), ((), ())),
                                                preferred_element_type=jnp.float32)
        return (dweight, dtemperature), dh

    xs = (hidden, targets, log_norm, g_logp) + ((entropy, g_entropy) if return_entropy else ())
    width, vocab = hidden.shape[-1], weight.size // hidden.shape[-1]
    init = (jnp.zeros((width, vocab), jnp.float32), jnp.zeros((), jnp.float32))
    (dweight, dtemperature), dhidden = jax.lax.scan(one_chunk, init, xs)
    dweight = dweight.T if tied else dweight
    return dhidden, dweight.astype(weight.dtype), dtemperature.astype(temperature.dtype), None


_fused_chunks.defvjp(_fused_forward, _fused_backward)


def _to_chunks(hidden, targets, chunk_size):
    """hidden [B, N, D], targets [B, N] -> [C, B, c, D], [C, B, c] (zero-padded), and the inverse for [C, B, c]."""
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    batch, length, width = hidden.shape
    chunk = min(chunk_size, length)
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [num_chunks, B, chunk, ...]: lax.map / scan run over the leading axis.
    hidden = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)

    def unchunk(x):  # [num_chunks, B, chunk] -> [B, N]
        return x.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]

    return hidden, targets, unchunk


def fused_chunked_logprobs(hidden: jax.Array, targets: jax.Array, weight: jax.Array, *, tied: bool,
                           temperature: Any = 1.0, chunk_size: int = 128, return_entropy: bool = False):
    """logp [B, N] (, entropy [B, N]) float32 of targets [B, N] under logits (hidden [B, N, D] @ W) / temperature.

    W is embed [V, D] when ``tied``, else lm_head [D, V]; it is cast to hidden's dtype for the
    matmuls, which sum in float32. Hand-written VJP (module docstring): gradients for hidden
    (its dtype), W (its dtype, summed over chunks in float32) and temperature. The float32 logit
    cotangent is cast to hidden's dtype for the two gradient matmuls, as ``low_precision_logits``
    does, so bf16 operands stay bf16 in the backward too.
    """
    _check_temperature(temperature)
    hidden_chunks, target_chunks, unchunk = _to_chunks(hidden, targets.astype(jnp.int32), chunk_size)
    temperature = jnp.asarray(temperature, jnp.float32)
    out = _fused_chunks(hidden_chunks, weight, temperature, target_chunks, bool(tied), bool(return_entropy))
    return jax.tree_util.tree_map(unchunk, out)


def chunked_logprobs_from_hidden(hidden: jax.Array, targets: jax.Array, params: dict, cfg: DecoderConfig, *,
                                 temperature: float = 1.0, chunk_size: int = 128, return_entropy: bool = False,
                                 fused: bool = True, batch_invariant: bool = False):
    """Log-probs of targets [B, N] under LM-head logits of hidden [B, N, D], ``chunk_size`` positions at a time.

    ``fused``: ``fused_chunked_logprobs``'s hand-written VJP; False: checkpointed chunks under autodiff.
    ``batch_invariant``: `models.batch_invariant.token_logprobs` (the JAX sampler's numbers, bit for bit).
    """
    _check_temperature(temperature)
    if batch_invariant:
        tied = cfg.tie_word_embeddings
        return invariant.token_logprobs(hidden.astype(jnp_dtype(cfg.compute_dtype)), targets,
                                        params["embed"] if tied else params["lm_head"], tied, temperature,
                                        return_entropy)
    if fused:
        tied = cfg.tie_word_embeddings
        weight = params["embed"] if tied else params["lm_head"]
        return fused_chunked_logprobs(hidden.astype(jnp_dtype(cfg.compute_dtype)), targets, weight, tied=tied,
                                      temperature=temperature, chunk_size=chunk_size, return_entropy=return_entropy)
    hidden, targets, unchunk = _to_chunks(hidden, targets, chunk_size)
    head = {"embed": params["embed"], "lm_head": params.get("lm_head")}

    def one_chunk(args):
        hidden_chunk, target_chunk = args
        logits = lm_head_logits(hidden_chunk, head, cfg)
        return logprobs_from_logits(logits, target_chunk, temperature=temperature, return_entropy=return_entropy)

    if hidden.shape[0] == 1:  # checkpointing would recompute the logits in the backward pass and save no memory
        result = jax.tree_util.tree_map(lambda x: x[None], one_chunk((hidden[0], targets[0])))
    else:
        result = jax.lax.map(jax.checkpoint(one_chunk), (hidden, targets))
    return jax.tree_util.tree_map(unchunk, result)


def token_logprobs(params: dict, cfg: DecoderConfig, tokens: jax.Array, *, attention_mask: jax.Array | None = None,
                   segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
                   temperature: float = 1.0, chunk_size: int = 128, return_entropy: bool = False,
                   remat: bool | str = False, batch_invariant: bool = False):
    """logp [B, T-1] float32: log pi(tokens[:, t+1] | tokens[:, :t+1]) at ``temperature``
    (+ entropy [B, T-1] of that next-token distribution when ``return_entropy``).

    Masks/positions are those of ``forward``. Values at padded targets are finite but
    meaningless: the caller masks them (e.g. with attention_mask[:, 1:]).
    """
    hidden, _ = forward(params, cfg, tokens, positions=positions, attention_mask=attention_mask,
                        segment_ids=segment_ids, return_hidden=True, remat=remat, batch_invariant=batch_invariant)
    return chunked_logprobs_from_hidden(hidden[:, :-1], tokens[:, 1:], params, cfg, temperature=temperature,
                                        chunk_size=chunk_size, return_entropy=return_entropy,
                                        batch_invariant=batch_invariant)
