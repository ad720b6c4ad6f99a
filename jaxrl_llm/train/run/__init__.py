"""The run: `train()` and the step loop, checkpoints and resume, metrics, tracking and provenance,
held-out evaluation, plots, the distillation teacher."""
