"""The learning stage of an RL step: learner arrays from rollouts, packing into micro-batches, the
`Learner` (pi_old and side passes, the jitted optimiser step), the reference and the critic, and
`learn()`, one step's learning."""
