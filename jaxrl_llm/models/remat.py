"""What a decoder layer keeps for the backward pass, and what it recomputes (rematerialisation).

Modes, by the name ``train.remat`` and ``forward(..., remat=)`` take:

* ``"off"``: keep every residual the backward pass needs (most memory, no recompute);
* ``"dots"``: keep only the outputs of matmuls without batch dimensions, i.e. the q/k/v/o and
  MLP projections (``jax.checkpoint_policies.dots_with_no_batch_dims_saveable``, and in bfloat16
  the outputs named ``models.matmul.PROJECTION``); the norms, rotary, SiLU and the attention
  (batched over heads) are recomputed from them;
* ``"full"``: keep only each layer's input and recompute the whole layer (Chen et al. 2016,
  "Training Deep Nets with Sublinear Memory Cost", arXiv 1604.06174): least memory, about
  one more forward pass of the layers.

Which is faster depends on the backend. In bfloat16 on XLA:CPU "full" beats "dots" (SmolLM2-135M
fwd+bwd, 2-core Intel Xeon: 8x512 1.16x, 2x2048 1.06x): the looped layers write each saved bf16
projection into an [nL, ...] stack, which costs more there than recomputing the projections.
In float32 "dots" is the faster of the two (8x512: 1.06x).

``True`` and ``False`` are read as ``"full"`` and ``"off"`` (what ``remat`` meant when it was a bool).
"""
from __future__ import annotations

from typing import Any, Callable

import jax

from jaxrl_llm.models.matmul import PROJECTION

REMAT_MODES = ("off", "dots", "full")


def remat_mode(value: Any) -> str:
    """The mode named by ``value`` (one of REMAT_MODES, or a bool); ValueError naming the valid ones."""
    if isinstance(value, bool):
        return "full" if value else "off"
    if value not in REMAT_MODES:
        raise ValueError(f"remat={value!r} is invalid; valid: one of {', '.join(map(repr, REMAT_MODES))} "
                         "(or a bool: True = 'full', False = 'off')")
    return value


def remat_policy(mode: str) -> Callable | None:
    """The ``jax.checkpoint`` policy of a mode other than "off" (None: save nothing but the inputs)."""
    policies = jax.checkpoint_policies
    dots = policies.save_from_both_policies(policies.dots_with_no_batch_dims_saveable,
                                            policies.save_only_these_names(PROJECTION))
    return {"dots": dots, "full": None}[remat_mode(mode)]
