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

Levers of the fused head (``HeadOptions``; the learner's call takes them from the environment,
``head_options``, so a benchmark can switch them without a config field):

* ``chunk_size`` (``JAXRL_LLM_HEAD_CHUNK``, default 128): positions per logits matmul. Larger
  chunks give the [c, D] x [D, V] matmul a larger M dimension (better tensor-core use) at
  O(c * V) float32 of scratch per chunk;
* ``logits_dtype`` (``JAXRL_LLM_HEAD_LOGITS``): "float32" (default) writes the matmul's float32
  accumulator out as is; "compute" rounds it to the compute dtype (bf16) on the way out, halving
  the logits' bytes, and the log-softmax still runs in float32 on the rounded values. Rounding to
  nearest moves each logit by at most u |z_v| (u = 2^-8 for bf16), and logsumexp is 1-Lipschitz
  in the max norm, so |delta log p| <= 2 u max_v |z_v| (tests/models/test_logprob_levers.py);
* ``matmul_dtype`` (``JAXRL_LLM_HEAD_MATMUL``): "compute" (default: bf16 operands summing in
  float32) or "float32" (hidden and W in float32: the exact reference, slower on tensor cores).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from functools import partial
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxrl_llm.models import batch_invariant as invariant
from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.decoder import forward, jnp_dtype, lm_head_logits


HEAD_CHUNK_SWITCH = "JAXRL_LLM_HEAD_CHUNK"
HEAD_LOGITS_SWITCH = "JAXRL_LLM_HEAD_LOGITS"
HEAD_MATMUL_SWITCH = "JAXRL_LLM_HEAD_MATMUL"
LOGITS_DTYPES = ("float32", "compute")
MATMUL_DTYPES = ("compute", "float32")


class HeadOptions(NamedTuple):
    """The fused LM head's levers (module docstring)."""

    chunk_size: int = 128
    logits_dtype: str = "float32"  # one of LOGITS_DTYPES
    matmul_dtype: str = "compute"  # one of MATMUL_DTYPES


def check_head_options(options: HeadOptions) -> HeadOptions:
    """``options`` if valid; ValueError naming the bad value and the valid ones."""
    chunk = options.chunk_size
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
        raise ValueError(f"chunk_size={chunk!r} must be a positive int")
    if options.logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype={options.logits_dtype!r} is invalid; valid: {', '.join(LOGITS_DTYPES)}")
    if options.matmul_dtype not in MATMUL_DTYPES:
        raise ValueError(f"matmul_dtype={options.matmul_dtype!r} is invalid; valid: {', '.join(MATMUL_DTYPES)}")
    return options


def head_options(environ: Mapping[str, str] | None = None) -> HeadOptions:
    """The levers set by JAXRL_LLM_HEAD_CHUNK / _LOGITS / _MATMUL (read when a step is traced), else the defaults."""
    environ = os.environ if environ is None else environ
    default = HeadOptions()
    chunk = environ.get(HEAD_CHUNK_SWITCH, "")
    if chunk and not chunk.isdigit():
        raise ValueError(f"{HEAD_CHUNK_SWITCH}={chunk!r} must be a positive integer")
    return check_head_options(HeadOptions(int(chunk) if chunk else default.chunk_size,
                                          environ.get(HEAD_LOGITS_SWITCH) or default.logits_dtype,
                                          environ.get(HEAD_MATMUL_SWITCH) or default.matmul_dtype))


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


def _logits(hidden: jax.Array, weight: jax.Array, tied: bool, out_dtype: str = "float32") -> jax.Array:
    """float32 logits [..., V] from hidden [..., D] and W (tied: embed [V, D], else lm_head [D, V]), one dtype;
    the matmul writes ``out_dtype`` ("float32" or "compute": hidden's dtype), read back as float32."""
    contract = 1 if tied else 0
    written = jnp.float32 if out_dtype == "float32" else hidden.dtype
    return jax.lax.dot_general(hidden, weight, (((hidden.ndim - 1,), (contract,)), ((), ())),
                               preferred_element_type=written).astype(jnp.float32)


def _chunk_stats(hidden, weight, temperature, targets, tied, return_entropy, logits_dtype="float32"):
    """One chunk: scaled logits z [B, c, V], logp, logsumexp and entropy (None unless asked) [B, c]."""
    scaled = _logits(hidden, weight, tied, logits_dtype) / temperature
    log_norm = jax.nn.logsumexp(scaled, axis=-1)
    logp = jnp.take_along_axis(scaled, targets[..., None], axis=-1)[..., 0] - log_norm
    entropy = None
    if return_entropy:  # per-entry log p, as logprobs_from_logits
        log_probs = scaled - log_norm[..., None]
        entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return scaled, logp, log_norm, entropy


@partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6))
def _fused_chunks(hidden, weight, temperature, targets, tied, return_entropy, logits_dtype):
    """hidden [C, B, c, D] (compute dtype), targets [C, B, c] -> logp (, entropy) [C, B, c] float32."""
    return _fused_forward(hidden, weight, temperature, targets, tied, return_entropy, logits_dtype)[0]


def _fused_forward(hidden, weight, temperature, targets, tied, return_entropy, logits_dtype):
    w = weight.astype(hidden.dtype)

    def one_chunk(args):
        _, logp, log_norm, entropy = _chunk_stats(args[0], w, temperature, args[1], tied, return_entropy,
                                                  logits_dtype)
        return logp, log_norm, entropy

    logp, log_norm, entropy = jax.lax.map(one_chunk, (hidden, targets))
    out = (logp, entropy) if return_entropy else logp
    # Residuals: the inputs and per-token scalars only, never a chunk's logits.
    return out, (hidden, weight, temperature, targets, log_norm, entropy)


def _fused_backward(tied, return_entropy, logits_dtype, residuals, cotangent):
    hidden, weight, temperature, targets, log_norm, entropy = residuals
    g_logp, g_entropy = cotangent if return_entropy else (cotangent, None)
    w = weight.astype(hidden.dtype)

    def one_chunk(carry, args):
        dweight, dtemperature = carry
        h, y, lse, g = args[:4]
        scaled = _logits(h, w, tied, logits_dtype) / temperature  # the one recompute (the forward's rounding)
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
                           temperature: Any = 1.0, chunk_size: int = 128, return_entropy: bool = False,
                           logits_dtype: str = "float32"):
    """logp [B, N] (, entropy [B, N]) float32 of targets [B, N] under logits (hidden [B, N, D] @ W) / temperature.

    W is embed [V, D] when ``tied``, else lm_head [D, V]; it is cast to hidden's dtype for the
    matmuls, which sum in float32. Hand-written VJP (module docstring): gradients for hidden
    (its dtype), W (its dtype, summed over chunks in float32) and temperature. The float32 logit
    cotangent is cast to hidden's dtype for the two gradient matmuls, as ``low_precision_logits``
    does, so bf16 operands stay bf16 in the backward too. ``logits_dtype``: see ``HeadOptions``.
    """
    _check_temperature(temperature)
    check_head_options(HeadOptions(chunk_size, logits_dtype))
    hidden_chunks, target_chunks, unchunk = _to_chunks(hidden, targets.astype(jnp.int32), chunk_size)
    temperature = jnp.asarray(temperature, jnp.float32)
    out = _fused_chunks(hidden_chunks, weight, temperature, target_chunks, bool(tied), bool(return_entropy),
                        logits_dtype)
    return jax.tree_util.tree_map(unchunk, out)


def chunked_logprobs_from_hidden(hidden: jax.Array, targets: jax.Array, params: dict, cfg: DecoderConfig, *,
                                 temperature: float = 1.0, chunk_size: int | None = None,
                                 return_entropy: bool = False, fused: bool = True, batch_invariant: bool = False,
                                 options: HeadOptions | None = None):
    """Log-probs of targets [B, N] under LM-head logits of hidden [B, N, D], ``chunk_size`` positions at a time.

    ``options``: the fused head's levers (``HeadOptions``; None: ``head_options()``, the environment's or
    the defaults); ``chunk_size``, when given, overrides the options' chunk.
    ``fused``: ``fused_chunked_logprobs``'s hand-written VJP; False: checkpointed chunks under autodiff
    (default logits and matmul dtypes only).
    ``batch_invariant``: `models.batch_invariant.token_logprobs` (the JAX sampler's numbers, bit for bit;
    the levers do not apply).
    """
    _check_temperature(temperature)
    options = check_head_options(head_options() if options is None else options)
    if chunk_size is not None:
        options = check_head_options(options._replace(chunk_size=chunk_size))
    chunk_size = options.chunk_size
    if batch_invariant:
        tied = cfg.tie_word_embeddings
        return invariant.token_logprobs(hidden.astype(jnp_dtype(cfg.compute_dtype)), targets,
                                        params["embed"] if tied else params["lm_head"], tied, temperature,
                                        return_entropy)
    if fused:
        tied = cfg.tie_word_embeddings
        weight = params["embed"] if tied else params["lm_head"]
        dtype = jnp.float32 if options.matmul_dtype == "float32" else jnp_dtype(cfg.compute_dtype)
        return fused_chunked_logprobs(hidden.astype(dtype), targets, weight, tied=tied, temperature=temperature,
                                      chunk_size=chunk_size, return_entropy=return_entropy,
                                      logits_dtype=options.logits_dtype)
    if options[1:] != HeadOptions()[1:]:
        raise ValueError(f"logits_dtype/matmul_dtype levers ({options}) need fused=True")
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
                   temperature: float = 1.0, chunk_size: int | None = None, return_entropy: bool = False,
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
