"""Off-policy corrections of peers that have no counterpart in core/corrections.py, and the
masked-token fraction of every mask as a metric (docs/objectives.md#mismatch-corrections).

Same signature and output as corrections.py: correction(old_logp, sampler_logp, mask, **hyper)
-> CorrectionOutput, all detached; lr_it = log pi_old_it - log mu_it on valid tokens.

Which arrays are which policy. In the RL loop (train/learn/step.py) `old_logp` is the learner's
pi_old pass at the start of the optimiser step (`Learner.step_logprobs` with the weights before
this step's first update; `StepInputs.old_logp`), and `sampler_logp` the rollout engine's
log-probs of the sampled tokens (`StepInputs.sampler_logp`), from weights up to
rollout.max_lag versions older. So `old_logp` is decoupled PPO's proximal policy pi_prox and
`sampler_logp` its behaviour policy mu; the current policy pi_theta is the loss's `logp`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_llm.core import _checks
from jaxrl_llm.core.corrections import (CorrectionOutput, check_bounds, log_bound, rejected, sequence_mis_mask,
                                        token_log_ratio, token_mis_mask, geometric_sequence_mask)

_WEIGHT_LOG_CAP = 20.0  # exp(20) ~ 5e8: an uncapped weight stays finite


def seq_mask_tis(old_logp, sampler_logp, mask, *, low: float = 0.999, high: float = 1.002) -> CorrectionOutput:
    """Sequence-masked TIS: raw token weights pi_old/mu, whole sequences rejected by their
    geometric-mean ratio.

      g_i = exp((1/L_i) sum_t m_it lr_it)
      keep_it = m_it [low <= g_i <= high],   w_it = keep_it exp(min(lr_it, 20))   (not truncated)

    Source: NeMo-RL's `truncated_importance_sampling_type: "seq-mask-tis"`
    (nemo_rl/algorithms/loss/loss_functions.py, NVIDIA-NeMo/RL 7ea279a), after Yao et al.'s
    "When Speed Kills Stability" (yingru.notion.site, 2025); the default bounds
    [0.999, 1.002] are NeMo-RL's ProRL v2.1 example (examples/configs/prorlv2_1_moe.v2.yaml).
    NeMo-RL zeroes a rejected sequence's weights but keeps its tokens in the loss's
    denominator; here, like every rejection in corrections.py, they leave it (keep = 0). The
    exponent is capped at 20 only so that no weight overflows (NeMo-RL: nan_to_num).

    Returns:
      CorrectionOutput; masked marks the rejected sequences' tokens, nothing is clipped.
    """
    check_bounds(low, high)
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    keep = geometric_sequence_mask(old_logp, sampler_logp, mask, low=low, high=high)
    weights = keep * jnp.exp(jnp.minimum(jnp.where(keep > 0, log_ratio, 0.0), _WEIGHT_LOG_CAP))
    return CorrectionOutput(weights, keep, jnp.zeros_like(keep), rejected(keep, valid))


def decoupled_ppo(old_logp, sampler_logp, mask, *, cap: float = 5.0) -> CorrectionOutput:
    """Decoupled PPO's behaviour weight pi_prox / mu, tokens over the cap masked (AReaL).

    The decoupled objective (Fu et al. 2025, AReaL, arXiv 2505.24298, eq. 5; Hilton et al. 2022,
    "Batch size-invariance for policy optimization", arXiv 2110.00641) clips the ratio of the
    current policy to the PROXIMAL one and weights by the proximal over the BEHAVIOUR policy:

      l_it = -(pi_prox_it / mu_it) min(r_it A_it, clip(r_it, 1 - eps, 1 + eps) A_it),
      r_it = pi_theta_it / pi_prox_it

    pi_prox is `old_logp` (the learner's pi_old recompute; module doc), mu is `sampler_logp`,
    and the recipe's policy loss supplies the clipped term on pi_theta / pi_old. This function
    gives the weight, with AReaL's cap: a token with pi_prox/mu > cap gets weight 0 but STAYS
    in the denominators (AReaL's `ppo_actor_loss_fn` divides by the loss mask's count from
    before rejection, "so mask mode does not inflate per-token gradients"):

      w_it = m_it exp(lr_it) [exp(lr_it) <= cap],   keep_it = m_it

    Source: AReaL (inclusionAI/AReaL 4aef98d) areal/utils/functional/functional.py,
    `apply_rejection_sampling` with level=token, action=mask, metric=ratio, upper=cap and no
    lower bound: the former default behave_imp_weight_cap = 5 in token_mask mode. (AReaL's
    clamp mode, weights truncated at the cap, is corrections.token_tis.)

    Returns:
      CorrectionOutput; masked marks the tokens over the cap, nothing is clipped.
    """
    _checks.check_positive("cap", cap)
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    over = valid & (log_ratio > log_bound(cap))
    weights = jnp.where(valid & ~over, jnp.exp(jnp.minimum(log_ratio, log_bound(cap))), 0.0)
    return CorrectionOutput(weights, valid.astype(jnp.float32), jnp.zeros_like(weights), over.astype(jnp.float32))


# The bounds at which `mask_fractions` reports every mask: each one's default, and for the
# geometric mask (no default) the tight window of its docstring.
MASK_BOUNDS = {"token_mis": (0.5, 5.0), "sequence_mis": 10.0, "geometric": (0.999, 1.001),
               "seq_mask_tis": (0.999, 1.002), "decoupled_cap": 5.0}


def mask_fractions(old_logp, sampler_logp, mask, bounds: dict | None = None) -> dict[str, jax.Array]:
    """The share of valid tokens each mask would reject on this batch, whatever the recipe's
    correction: {"mask_fraction_<name>": float32 scalar} for the names of MASK_BOUNDS, at those
    bounds (`bounds` replaces some). 0 for a batch without valid tokens.

      token_mis      1 - [low <= pi_old/mu <= high]           (IcePop)
      sequence_mis   [rho_i > C]                              (Precision-RL)
      geometric      1 - [low <= g_i <= high]                 (DeepSeek-V3.2, verl Geo-RS)
      seq_mask_tis   as geometric, at its own bounds          (NeMo-RL)
      decoupled_cap  [pi_prox/mu > cap]                       (AReaL)
    """
    bounds = {**MASK_BOUNDS, **(bounds or {})}
    unknown = sorted(set(bounds) - set(MASK_BOUNDS))
    if unknown:
        raise ValueError(f"mask_fractions: unknown masks {unknown}; valid: {', '.join(MASK_BOUNDS)}")
    log_ratio, valid = token_log_ratio(old_logp, sampler_logp, mask)
    (mis_low, mis_high), (geo_low, geo_high), (smt_low, smt_high) = (
        bounds["token_mis"], bounds["geometric"], bounds["seq_mask_tis"])
    keeps = {
        "token_mis": token_mis_mask(old_logp, sampler_logp, mask, low=mis_low, high=mis_high),
        "sequence_mis": sequence_mis_mask(old_logp, sampler_logp, mask, cap=bounds["sequence_mis"]),
        "geometric": geometric_sequence_mask(old_logp, sampler_logp, mask, low=geo_low, high=geo_high),
        "seq_mask_tis": geometric_sequence_mask(old_logp, sampler_logp, mask, low=smt_low, high=smt_high),
        "decoupled_cap": (valid & (log_ratio <= log_bound(bounds["decoupled_cap"]))).astype(jnp.float32),
    }
    count = jnp.maximum(jnp.sum(valid), 1)
    return {f"mask_fraction_{name}": jnp.sum(rejected(keep, valid)) / count for name, keep in keeps.items()}


CORRECTIONS = {"seq_mask_tis": seq_mask_tis, "decoupled_ppo": decoupled_ppo}
