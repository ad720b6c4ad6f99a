"""TPU tooling: programs compiled ahead of time for TPU topologies from shapes alone, on a machine
without a TPU (issue 60). Imports only `benchmarks.common` of the benchmark rooms."""
