"""Chain-of-thought tasks: reasoning-gym questions with a "think step by step" instruction
and the answer in ``\\boxed{}`` (graded by reasoning-gym's own verifier on the last box,
:func:`jaxrl_llm.rewards.reasoning_gym_reward`), the setting of long-reasoning RL
(DeepSeek-AI 2025, R1; Liu et al. 2025, Dr. GRPO, arXiv 2503.20783).

  cot_gsm_symbolic   grade-school word problems (GSM-Symbolic templates): the GPU-scale
                     setting, generations of 1k+ tokens
  cot_chain_sum      sums of 2-3 numbers of 1-2 digits: the same code path at CPU scale
"""
from __future__ import annotations

COT_INSTRUCTION = "\n\nThink step by step, then give your final answer as \\boxed{answer}."
COT_TASKS = {
    "cot_gsm_symbolic": ("gsm_symbolic", {}),
    "cot_chain_sum": ("chain_sum", {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}),
}
