"""Benchmarks: each measures ours against a reference in the same run and prints the ratio.

    python -m jaxrl_llm.benchmarks.model     # learner fwd+bwd tokens/s vs PyTorch, logprob memory, weight sync
    python -m jaxrl_llm.benchmarks.rollout   # rollout engines (see that module)
    python -m jaxrl_llm.benchmarks.code_sandbox   # sandboxed code executions/s through the grader pool
    python -m jaxrl_llm.benchmarks.async_vs_sync --config EXP --max-lag 0 1   # jaxrl train per rollout.max_lag
"""
