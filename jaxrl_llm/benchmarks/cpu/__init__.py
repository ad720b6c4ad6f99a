"""Studies run on this CPU machine, each against a reference in the same run: the learner vs PyTorch
(`model`, `op_profile`), rollout engines and weight sync into vLLM's CPU server (`rollout`,
`weight_sync`), LoRA and the objectives' cost, the sandbox, async vs sync rollouts, the sampler paired
against an older commit and its compile time on CPU, the log-prob offset trials. Imports only
`benchmarks.common` of the benchmark rooms."""
