"""Routing replay in the learner (`train.routing_replay`): the sampler's routing records laid out
like the learner's tokens, the refusals, and the routing metrics.

R3 (Ma et al. 2025, "Stabilizing MoE Reinforcement Learning by Aligning Training and Inference
Routers", arXiv 2510.11370): with ``routing_replay="sampler"`` the learner's pi_old pass and its
gradient pass route every token to the experts the sampler chose for it
(`RolloutRecord.routed_experts`), the gates still coming from the learner's router
(`models.moe`). "off": the learner's router chooses (the records, when the sampler returned them,
only feed the metrics).

Layout: a record's row t is the token at position t of prompt + completion, for the P + L - 1
tokens the sampler forwarded. `sequence_routing` puts row t at that token's column of the
`SequenceBatch` ([left padding | prompt | completion | right padding]); every other column
(padding, the last sampled token, a sample without a record) holds -1, which `models.moe` reads as
"no record: the router's own top-k". `train.learn.packing` then moves these rows with their tokens.

Metrics (MoE policies, when the sampler's records are there):

* ``routing/differs_frac``: the share of completion tokens (the response mask) for which, in at
  least one layer, the learner's own top-k SET (its current params, no replay) differs from the
  sampler's record. A completion token's routing is read at the position that predicts it (the
  token before it; the last prompt token for the first one), whose output gives its log-prob: so
  every completion token has a record, the last sampled one included.
* ``routing/mismatch_k3_replay_<mode>``: the step's ``mismatch_k3`` (`core.corrections.mismatch_metrics`,
  sampler log-probs against the learner's pi_old) under the mode that ran, "off" or "sampler".
"""
from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models import DecoderConfig
from jaxrl_llm.utils.typed_config import ConfigError

ROUTING_REPLAY_MODES = ("off", "sampler")
NO_RECORD = -1  # a token row the sampler has no record of: routed by the learner's own top-k


def check_routing_replay(mode: str, model_cfg: DecoderConfig) -> str:
    """``mode`` itself; ConfigError for an unknown mode, or for "sampler" with a dense policy (naming its architecture)."""
    if mode not in ROUTING_REPLAY_MODES:
        raise ConfigError(f"train.routing_replay={mode!r}; valid: {ROUTING_REPLAY_MODES}")
    if mode == "sampler" and not model_cfg.is_moe:
        raise ConfigError(f"train.routing_replay='sampler' needs a mixture-of-experts policy; the policy is "
                         f"{model_cfg.architecture} (dense); valid: train.routing_replay='off'")
    return mode


def record_shape(model_cfg: DecoderConfig) -> tuple[int, int]:
    """(num_layers, num_experts_per_tok): the trailing axes of a MoE policy's routing record."""
    return model_cfg.num_layers, model_cfg.num_experts_per_tok


def check_records(records: Sequence, model_cfg: DecoderConfig, *, required: bool) -> None:
    """Every record's routed_experts fits the policy ([*, num_layers, top_k]); with ``required``
    (routing_replay="sampler") every record has one. ValueError naming the first sample that fails."""
    want = record_shape(model_cfg) if model_cfg.is_moe else None
    for r in records:
        name = f"sample (prompt_index={r.prompt_index}, sample_index={r.sample_index})"
        if r.routed_experts is None:
            if required:
                raise ValueError(f"train.routing_replay='sampler', but {name} has no routed_experts record; valid: "
                                 "an engine that records routing (rollout.return_routed_experts=true)")
            continue
        if want is None:
            raise ValueError(f"{name} has routed_experts, but the policy {model_cfg.architecture} is dense")
        if tuple(r.routed_experts.shape[1:]) != want:
            raise ValueError(f"{name} has routed_experts of shape {r.routed_experts.shape}; valid: "
                             f"[P + L - 1, num_layers, num_experts_per_tok] = [*, {want[0]}, {want[1]}]")


def sequence_routing(records: Sequence, prompt_width: int, width: int) -> np.ndarray | None:
    """The records' routing laid out like `build_sequences`' tokens: int32 [N, width, nL, k], row t
    of record i at column prompt_width - P_i + t, NO_RECORD elsewhere; None when no record has one."""
    shapes = {r.routed_experts.shape[1:] for r in records if r.routed_experts is not None}
    if not shapes:
        return None
    if len(shapes) > 1:
        raise ValueError(f"the step's routed_experts records disagree on [num_layers, top_k]: {sorted(shapes)}")
    out = np.full((len(records), width, *shapes.pop()), NO_RECORD, np.int32)
    for i, r in enumerate(records):
        if r.routed_experts is not None:
            start = prompt_width - r.prompt_token_ids.size
            out[i, start:start + r.routed_experts.shape[0]] = r.routed_experts
    return out


def differs_at_heads(own: jax.Array, record: jax.Array, head_slots: jax.Array) -> jax.Array:
    """float32 [R * T_c]: 1 where, at the flat slot head_slots[j] of rows [R, W], the experts ``own``
    [R, W, nL, k] and the ``record`` (same shape) are different SETS in at least one layer; 0 where
    they agree or the record has no row (NO_RECORD)."""
    def at_heads(x):
        return jnp.take(x.reshape(-1, *x.shape[2:]), head_slots, axis=0)

    own, record = jnp.sort(at_heads(own), axis=-1), jnp.sort(at_heads(record), axis=-1)
    recorded = jnp.all(record >= 0, axis=(-2, -1))
    return (recorded & jnp.any(own != record, axis=(-2, -1))).astype(jnp.float32)


def routing_metrics(mode: str, differs, mask, step_metrics: dict) -> dict[str, float]:
    """``routing/differs_frac`` (when measured: ``differs`` [N, T_c], else None) over the mask's
    completion tokens and ``routing/mismatch_k3_replay_<mode>`` (when the step has mismatch_k3)."""
    out = {}
    if differs is not None:
        mask = jnp.asarray(mask, jnp.float32)
        out["routing/differs_frac"] = float(jnp.sum(differs * mask) / jnp.maximum(jnp.sum(mask), 1.0))
    if "mismatch_k3" in step_metrics:
        out[f"routing/mismatch_k3_replay_{mode}"] = float(step_metrics["mismatch_k3"])
    return out
