"""GPU tooling: `make gpu-check` (`gpu_check` with its plan, report and sections) and `make gpu-sweep`
(`gpu_sweep`, `levers`), the learner's MFU and phases, the sampler against its bandwidth roofline, an RL
run on the device and the PyTorch learner reference. Each runs at CPU size with --tiny. Imports only
`benchmarks.common` of the benchmark rooms."""
