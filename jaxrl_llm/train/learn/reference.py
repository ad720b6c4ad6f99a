"""The frozen reference policy pi_ref of the KL-to-reference term.

pi_ref is the policy the run started from (the KL regulariser of RLHF-style PPO,
Ouyang et al. 2022, and of GRPO, Shao et al. 2024). Its log-probs are computed in the
learner's pi_old pass (`Learner.step_logprobs`): the same jitted, micro-batched and
sharded program, one more forward per micro-batch, no second pass over the data.

* Full fine-tuning: a copy of the initial params is kept, already cast to the
  learner's compute dtype (fp32 / bf16 / fp16, the precision policy of
  `train.precision`), so it costs params x bytes-per-element of that dtype
  (SmolLM2-135M: 0.54 GB fp32, 0.27 GB bf16) and follows the params' sharding.
* LoRA: the frozen float32 base is the initial policy (the adapters start with
  B = 0), so the reference is the base itself and costs nothing extra.

On --resume the loop rebuilds the learner from model.source, so the reference is the
same initial params, bit for bit, without being stored in checkpoints.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def reference_copy(params, compute_dtype) -> object:
    """The reference weights: `params` cast to the compute dtype (a copy, on the params'
    devices and sharding)."""
    return jax.tree.map(lambda x: jnp.asarray(x).astype(compute_dtype), params)


def tree_bytes(tree) -> int:
    """Bytes held by the arrays of `tree` (global sizes; 0 for None)."""
    return int(sum(np.prod(x.shape) * jnp.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))
