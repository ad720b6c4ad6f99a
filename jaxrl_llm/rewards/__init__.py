"""jaxrl_llm.rewards: verifiers and the parallel grading pool. Plain Python, no JAX.

Every reward has the signature ``reward(completion_text, example) -> float``
where ``example`` has ``answer`` and ``metadata`` (see jaxrl_llm.data.Example).
This package imports nothing else of jaxrl_llm.
"""
from jaxrl_llm.rewards.code_grader import SCORINGS, CodeRunError, code_reward
from jaxrl_llm.rewards.extract import (
    extract_code_block,
    extract_integer_answer,
    extract_last_boxed,
    extract_tagged_answer,
    normalize_math_answer,
)
from jaxrl_llm.rewards.graders import (
    BUILTIN_GRADERS,
    RewardFn,
    addition_reward,
    exact_match_reward,
    gold_math_answer,
    math_answers_equal,
    math_verify_reward,
    reasoning_gym_answer_text,
    reasoning_gym_reward,
    trusted_in_process,
    warm_up_with,
)
from jaxrl_llm.rewards.judge import JudgeReward, ScoreFormat, check_rubric, grades_in_batches, judge_prompt
from jaxrl_llm.rewards.pool_worker import GraderTimeout, Suspected
from jaxrl_llm.rewards.sandbox import SandboxLimits, SandboxUnavailable, sandbox_tool
from jaxrl_llm.rewards.sandbox_session import Call, CallResult, SandboxSession, run_calls
from jaxrl_llm.rewards.pool import GradeResult, GraderPool, grade_batch, grade_in_process
from jaxrl_llm.rewards.weighted import WeightedRewards, reward_parts

__all__ = [
    "SCORINGS",
    "CodeRunError",
    "GraderTimeout",
    "JudgeReward",
    "ScoreFormat",
    "check_rubric",
    "grades_in_batches",
    "judge_prompt",
    "SandboxLimits",
    "SandboxUnavailable",
    "code_reward",
    "extract_code_block",
    "Call",
    "CallResult",
    "SandboxSession",
    "Suspected",
    "run_calls",
    "sandbox_tool",
    "BUILTIN_GRADERS",
    "GradeResult",
    "GraderPool",
    "RewardFn",
    "WeightedRewards",
    "addition_reward",
    "exact_match_reward",
    "extract_integer_answer",
    "extract_last_boxed",
    "extract_tagged_answer",
    "gold_math_answer",
    "grade_batch",
    "grade_in_process",
    "math_answers_equal",
    "math_verify_reward",
    "normalize_math_answer",
    "reasoning_gym_answer_text",
    "reasoning_gym_reward",
    "reward_parts",
    "trusted_in_process",
    "warm_up_with",
]
