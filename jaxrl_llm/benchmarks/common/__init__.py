"""What more than one benchmark room uses: the timer and progress line (`timing`), the model shapes
(`model_shapes`), the RL-like step batches and their model FLOPs (`rl_batch`), where results go and what
they record (`results`), the small decoder trained from scratch on addition (`addition_start`), and the
batch-invariance study that both `make bench-batch-invariance` and `make gpu-check` run. Imports no
other benchmark room."""
