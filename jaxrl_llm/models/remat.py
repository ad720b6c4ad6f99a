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

Which is faster depends on the backend. In bfloat16 on XLA:CPU "full" beats "dots": the looped
layers write each saved bf16 projection into an [nL, ...] stack, which costs more there than
recomputing the projections. In float32 "dots" is the faster of the two (measurements:
``python -m jaxrl_llm.benchmarks.learner_levers``, docs/benchmarks.md).

``True`` and ``False`` are read as ``"full"`` and ``"off"`` (what ``remat`` meant when it was a bool).

``"auto"`` (a setting, see ``remat_setting``; not a mode ``forward`` takes) picks the mode from the
compiled program's memory estimate on the device at hand: ``choose_remat`` compiles the step with
"off", then "dots", then "full", and keeps the first whose ``program_bytes`` (arguments + outputs
+ temporaries + code - aliased, from XLA's ``memory_analysis``) fits ``device_memory_budget``; it
stops at the first that fits, so a program that fits without remat is compiled once. Full remat
used to be the GPU default because XLA's attention writes every [B, H, T, T] score matrix to
memory and the backward pass keeps them, which dwarfs the rest of a layer at long T. With the
cuDNN fused attention kernel (``models/fused_attention.py``) the scores are never materialised,
so a layer's residuals are the projections and elementwise activations, O(T) per token row:
"dots" keeps the projections and recomputes only the cheap norms/rotary/SiLU/attention, and "off"
often fits outright. Where the backend reports no memory limit (XLA:CPU) no estimate can be
checked, and the caller's fallback is used without compiling. The choice and its estimates are
logged (logger ``jaxrl_llm.models.remat``, INFO).
"""
from __future__ import annotations

import logging
from typing import Any, Callable, NamedTuple

import jax

from jaxrl_llm.models.matmul import PROJECTION

logger = logging.getLogger(__name__)

REMAT_MODES = ("off", "dots", "full")
REMAT_CHOICES = REMAT_MODES + ("auto",)  # what a setting (e.g. train.remat) may say; "auto": choose_remat


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


def remat_setting(value: Any) -> str:
    """The setting named by ``value``: "auto" or a mode (see ``remat_mode``); ValueError naming the valid ones."""
    if value == "auto" and isinstance(value, str):
        return "auto"
    if isinstance(value, bool) or value in REMAT_MODES:
        return remat_mode(value)
    raise ValueError(f"remat={value!r} is invalid; valid: one of {', '.join(map(repr, REMAT_CHOICES))} "
                     "(or a bool: True = 'full', False = 'off')")


def device_memory_budget(device: Any = None, fraction: float = 0.9) -> int | None:
    """Bytes a program may use on ``device`` (default: the first local device): ``fraction`` of the
    allocator's ``bytes_limit``; None where the backend reports no memory stats (XLA:CPU returns
    None from ``memory_stats()``) or no ``bytes_limit``.

    ``bytes_in_use`` is deliberately not subtracted: what is resident when the step is chosen is
    mostly the params and optimizer state, which are the step's arguments and so are already in
    ``program_bytes``; subtracting them too would count them twice and push toward more remat than
    needed. ``1 - fraction`` is the headroom for what the estimate does not see (fragmentation,
    other live buffers such as a reference model's params); a caller holding more passes less.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction={fraction!r} must be in (0, 1]")
    device = jax.local_devices()[0] if device is None else device
    stats = device.memory_stats()
    if not stats or not stats.get("bytes_limit"):
        return None
    return int(stats["bytes_limit"] * fraction)


def program_bytes(compiled: Any) -> int:
    """Device bytes a compiled program needs at once, from XLA's ``memory_analysis()``: arguments +
    outputs + temporaries + generated code - the bytes outputs alias (donated) arguments.
    ValueError where the backend gives no analysis (``memory_analysis()`` returns None)."""
    stats = compiled.memory_analysis()
    if stats is None:
        raise ValueError("the compiled program has no memory analysis (memory_analysis() returned None)")
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               + stats.generated_code_size_in_bytes - stats.alias_size_in_bytes)


class RematChoice(NamedTuple):
    """The mode ``choose_remat`` picked, the bytes estimated for each mode it compiled (in order),
    the budget it compared them with (None: no budget known) and why, in words."""
    mode: str
    estimates: dict[str, int]
    budget: int | None
    reason: str


def choose_remat(compile_mode: Callable[[str], Any], budget_bytes: int | None,
                 modes: tuple[str, ...] = REMAT_MODES, fallback: str = "full") -> RematChoice:
    """The first of ``modes`` (least recompute first) whose compiled program fits ``budget_bytes``.

    ``compile_mode(mode)`` returns the step compiled with that remat mode (a ``jax.stages.Compiled``,
    e.g. ``jax.jit(step).lower(...).compile()``); modes are compiled lazily, in order, and the search
    stops at the first whose ``program_bytes`` is at most the budget. With ``budget_bytes`` None (no
    memory stats on this backend) nothing is compiled and ``fallback`` is returned. If none fits,
    the last mode (the one keeping least; "full" by default) is returned with a reason saying it
    may not fit. The choice is logged at INFO.
    """
    modes = tuple(remat_mode(m) for m in modes)
    if not modes:
        raise ValueError("modes is empty")
    if budget_bytes is None:
        choice = RematChoice(remat_mode(fallback), {}, None,
                             f"no device memory budget known (backend reports no memory stats); "
                             f"using the fallback {fallback!r} without compiling")
    else:
        estimates: dict[str, int] = {}
        choice = None
        for mode in modes:
            estimates[mode] = program_bytes(compile_mode(mode))
            if estimates[mode] <= budget_bytes:
                choice = RematChoice(mode, estimates, budget_bytes,
                                     f"{mode!r} needs {estimates[mode]} bytes <= budget {budget_bytes}")
                break
        if choice is None:
            last = modes[-1]
            choice = RematChoice(last, estimates, budget_bytes,
                                 f"no mode fits: {last!r} needs {estimates[last]} bytes > budget {budget_bytes};"
                                 f" using {last!r}, which may not fit (out of memory)")
    logger.info("remat: chose %r (%s); estimates %s", choice.mode, choice.reason, choice.estimates)
    return choice
