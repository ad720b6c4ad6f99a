"""Benchmarks, in rooms by target: each measures ours against a reference in the same run.

    cpu/      studies on this CPU machine (learner vs PyTorch, rollout engines, LoRA, objectives, ...)
    gpu/      `make gpu-check` / `make gpu-sweep` and the accelerator measurements they run
    tpu/      programs compiled ahead of time for TPU topologies
    common/   what more than one room uses (timer, model shapes, RL batches, where results go)

Rooms import only `common` (tests/structure/test_import_graph.py); results go to the repository's
benchmarks/results/ (`common.results.RESULTS_DIR`). For example:

    python -m jaxrl_llm.benchmarks.cpu.model     # learner fwd+bwd tokens/s vs PyTorch, logprob memory, weight sync
    python -m jaxrl_llm.benchmarks.cpu.rollout   # rollout engines (see that module)
    python -m jaxrl_llm.benchmarks.cpu.code_sandbox   # sandboxed code executions/s through the grader pool
    python -m jaxrl_llm.benchmarks.cpu.humaneval_grading   # HumanEval's 164 canonical / wrong solutions through the code grader
    python -m jaxrl_llm.benchmarks.cpu.async_vs_sync --config EXP --max-lag 0 1   # jaxrl train per rollout.max_lag
    python -m jaxrl_llm.benchmarks.gpu.gpu_check --tiny   # the accelerator check at CPU size
"""
