"""jaxrl_llm.core: the pure math of RL post-training (stated in docs/objectives.md).

Imports jax, chex and numpy only; no I/O. Topic files:
  advantages   GRPO, Dr. GRPO, RLOO, batch-std, REINFORCE++, OPO, pass@k, GAE
  losses       per-token policy losses with one common signature
  trust_region DPPO's divergence-based trust region (TV and KL forms)
  entropy_control  Clip-Cov / KL-Cov and their top-covariance token selection
  gpg          GPG's rescaled group-centred advantage (optionally std-normalised)
  pass_at_k_tang  Tang et al.'s pass@k advantage (verl's grpo_passk)
  aggregation  explicit token weights and the micro-batch-exact weighted sum
  kl           k1 / k2 / k3 estimators
  distill      on-policy distillation: the teacher's per-token reverse-KL advantage
  corrections  training-inference mismatch (TIS / MIS) and its metrics
  off_policy   NeMo-RL's seq-mask-tis, AReaL's decoupled PPO weight, every mask's masked fraction
  filters      zero-variance groups, truncation, DAPO overlong penalty
  length_rewards  L1 (LCPO) target-length and Kimi k1.5 group length rewards
  diversity    DARLING equivalence classes and diversity rewards (host-side)
  bias         implied gradient weights and difficulty weights
  evaluation   pass@k, avg@k
  vineppo      VinePPO chunk starts, Monte-Carlo values, chunk advantages
  remax        ReMax: the greedy response's reward as the baseline
  multi_reward GDPO: several rewards, each normalised within its group, then summed
  recipe_overrides  ADVANTAGES by name and customize_recipe (parts of a recipe by name)
  recipes      named compositions (grpo, dr_grpo, dapo, ...): Recipe, RECIPES, get_recipe
  step_inputs  StepInputs: one step's data from the sampler to the loss, with the estimator's extras
  step_batch   the two functions the learner calls with a recipe: prepare_step_batch,
               recipe_loss; the StepBatch between them and micro_batches

Conventions: N = P prompts x G samples, rows prompt-major (row i = prompt
i // G); token arrays and masks [N, T]; rewards [P, G].
"""
from jaxrl_llm.core.advantages import (
    GaeOutput,
    batch_std_advantages,
    broadcast_to_tokens,
    dr_grpo_advantages,
    gae_advantages,
    grpo_advantages,
    opo_advantages,
    pass_at_k_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    terminal_token_rewards,
    validate_rewards,
)
from jaxrl_llm.core.aggregation import (
    AGGREGATION_MODES,
    aggregate,
    check_mode,
    num_responses,
    response_lengths,
    token_weights,
)
from jaxrl_llm.core.bias import difficulty_weight, implied_sequence_weight, implied_token_weight
from jaxrl_llm.core.corrections import (
    CorrectionOutput,
    geometric_sequence_mask,
    geometric_sequence_rejection,
    mismatch_metrics,
    sequence_log_ratio,
    sequence_mis,
    sequence_mis_mask,
    sequence_tis,
    sequence_tis_weights,
    token_log_ratio,
    token_mis,
    token_mis_mask,
    token_tis,
    token_tis_weights,
)
from jaxrl_llm.core.diversity import (
    darling_rewards,
    darling_rewards_batch,
    diversity_from_classes,
    diversity_scores,
    equivalence_classes,
    ngram_overlap_predicate,
    same_normalised_text,
)
from jaxrl_llm.core.evaluation import avg_at_k, pass_at_k
from jaxrl_llm.core.filters import (
    expand_group_mask,
    mask_truncated,
    overlong_penalty,
    zero_variance_group_mask,
)
from jaxrl_llm.core.length_rewards import kimi_length_reward, l1_length_reward
from jaxrl_llm.core.distill import Distillation, distill_advantages, reverse_kl_advantages, reverse_kl_mean
from jaxrl_llm.core.kl import KL_ESTIMATORS, get_kl_estimator, kl_k1, kl_k2, kl_k3
from jaxrl_llm.core.entropy_control import clip_cov_loss, covariance_scores, kl_cov_loss, top_covariance_tokens
from jaxrl_llm.core.gpg import gpg_advantages
from jaxrl_llm.core.losses import (
    PolicyLossOutput,
    cispo_loss,
    clipped_value_loss,
    gmpo_loss,
    gspo_loss,
    is_pg_sequence_loss,
    pg_loss,
    ppo_clip_loss,
    sapo_loss,
)
from jaxrl_llm.core.multi_reward import gdpo_advantages
from jaxrl_llm.core.remax import remax_advantages
from jaxrl_llm.core.off_policy import decoupled_ppo, mask_fractions, seq_mask_tis
from jaxrl_llm.core.pass_at_k_tang import pass_at_k_tang_advantages
from jaxrl_llm.core.recipe_overrides import ADVANTAGES, CORRECTIONS, POLICY_LOSSES, customize_recipe
from jaxrl_llm.core.recipes import (
    KL_MODES,
    RECIPES,
    GaeAdvantage,
    GreedyBaselineAdvantage,
    GroupAdvantage,
    MonteCarloAdvantage,
    MultiRewardAdvantage,
    OverlongPenalty,
    Recipe,
    TokenAdvantage,
    TokenAdvantages,
    get_recipe,
)
from jaxrl_llm.core.trust_region import binary_kl, binary_tv, dppo_kl_loss, dppo_tv_loss
from jaxrl_llm.core.step_inputs import StepInputs, estimator_inputs, mini_batch
from jaxrl_llm.core.step_batch import StepBatch, micro_batches, prepare_step_batch, recipe_loss, restrict_rows
from jaxrl_llm.core.vineppo import chunk_advantages, chunk_starts, mc_values
