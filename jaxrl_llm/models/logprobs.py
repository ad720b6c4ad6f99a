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
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_llm.models.config import DecoderConfig
from jaxrl_llm.models.decoder import forward, lm_head_logits


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


def chunked_logprobs_from_hidden(hidden: jax.Array, targets: jax.Array, params: dict, cfg: DecoderConfig, *,
                                 temperature: float = 1.0, chunk_size: int = 128, return_entropy: bool = False):
    """Log-probs of targets [B, N] under LM-head logits of hidden [B, N, D], ``chunk_size`` positions at a time."""
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size={chunk_size!r} must be a positive int")
    _check_temperature(temperature)
    batch, length, width = hidden.shape
    chunk = min(chunk_size, length)
    num_chunks = -(-length // chunk)
    pad = num_chunks * chunk - length
    hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, pad)))
    # [num_chunks, B, chunk, ...]: lax.map runs over the leading axis.
    hidden = hidden.reshape(batch, num_chunks, chunk, width).swapaxes(0, 1)
    targets = targets.reshape(batch, num_chunks, chunk).swapaxes(0, 1)
    head = {"embed": params["embed"], "lm_head": params.get("lm_head")}

    def one_chunk(args):
        hidden_chunk, target_chunk = args
        logits = lm_head_logits(hidden_chunk, head, cfg)
        return logprobs_from_logits(logits, target_chunk, temperature=temperature, return_entropy=return_entropy)

    if num_chunks == 1:  # checkpointing would recompute the logits in the backward pass and save no memory
        result = jax.tree_util.tree_map(lambda x: x[None], one_chunk((hidden[0], targets[0])))
    else:
        result = jax.lax.map(jax.checkpoint(one_chunk), (hidden, targets))

    def unchunk(x):  # [num_chunks, B, chunk] -> [B, N]
        return x.swapaxes(0, 1).reshape(batch, num_chunks * chunk)[:, :length]

    return jax.tree_util.tree_map(unchunk, result)


def token_logprobs(params: dict, cfg: DecoderConfig, tokens: jax.Array, *, attention_mask: jax.Array | None = None,
                   segment_ids: jax.Array | None = None, positions: jax.Array | None = None,
                   temperature: float = 1.0, chunk_size: int = 128, return_entropy: bool = False,
                   remat: bool | str = False):
    """logp [B, T-1] float32: log pi(tokens[:, t+1] | tokens[:, :t+1]) at ``temperature``
    (+ entropy [B, T-1] of that next-token distribution when ``return_entropy``).

    Masks/positions are those of ``forward``. Values at padded targets are finite but
    meaningless: the caller masks them (e.g. with attention_mask[:, 1:]).
    """
    hidden, _ = forward(params, cfg, tokens, positions=positions, attention_mask=attention_mask,
                        segment_ids=segment_ids, return_hidden=True, remat=remat)
    return chunked_logprobs_from_hidden(hidden[:, :-1], tokens[:, 1:], params, cfg, temperature=temperature,
                                        chunk_size=chunk_size, return_entropy=return_entropy)
