"""Input checks and dtype handling shared by the core topic files (private).

Every public core function checks ranks, dtypes and shapes at the door and
computes in float32 when handed bfloat16 or float16: 16-bit floats lose the
small differences (log-ratios, variance terms, long sums) these objectives
are made of.
"""
from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np


def to_float32(x) -> jax.Array:
    """Returns `x` as an array of at least float32 precision.

    bfloat16 / float16 are promoted to float32; float32 (and float64 when x64
    is enabled) stay as they are; bool and integer arrays become float32.
    """
    x = jnp.asarray(x)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return x.astype(jnp.promote_types(x.dtype, jnp.float32))
    return x.astype(jnp.float32)


def valid_tokens(mask) -> jax.Array:
    """Boolean [N, T] array, True where `mask` is non-zero (bool, int or float masks)."""
    mask = jnp.asarray(mask)
    chex.assert_rank(mask, 2)
    return mask != 0


def check_float(x, rank: int) -> None:
    """chex checks at the door: `x` has the given rank and a floating dtype."""
    chex.assert_rank(x, rank)
    chex.assert_type(x, float)


def check_same_shape(**arrays) -> None:
    """Raises ValueError naming every array and its shape if the shapes differ.

    Skips arguments that are None (optional inputs).
    """
    shapes = {name: tuple(jnp.shape(a)) for name, a in arrays.items() if a is not None}
    if len(set(shapes.values())) > 1:
        listed = ", ".join(f"{name} has shape {shape}" for name, shape in shapes.items())
        raise ValueError(f"shape mismatch: {listed}; these arrays must share one shape")


def check_rows_match(groups_shape: tuple, mask_shape: tuple, what: str = "rewards") -> None:
    """Raises ValueError unless P * G of a [P, G] array equals N of a [N, T] mask."""
    num_prompts, group_size = groups_shape
    if num_prompts * group_size != mask_shape[0]:
        raise ValueError(
            f"{what} shape {tuple(groups_shape)} holds P*G={num_prompts * group_size} responses "
            f"but mask shape {tuple(mask_shape)} has N={mask_shape[0]} rows; rows must be "
            "prompt-major (row i = prompt i // G) with N = P * G"
        )


def is_concrete(x) -> bool:
    """True when `x` holds real values (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def all_concrete(*xs) -> bool:
    return all(is_concrete(x) for x in xs if x is not None)


def check_positive(name: str, value, *, allow_zero: bool = False) -> None:
    """Host-side check of a Python hyperparameter; skipped for traced values."""
    if not is_concrete(value):
        return
    value = float(np.asarray(value))
    ok = value >= 0 if allow_zero else value > 0
    if not (ok and np.isfinite(value)):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")


def masked_zero(x: jax.Array, valid: jax.Array) -> jax.Array:
    """`x` with invalid positions replaced by 0 BEFORE any arithmetic.

    Replacing the input (not multiplying the output by the mask) is what keeps
    padding harmless: NaN or inf logprobs in padded positions never reach an
    exp or a product, so both the value and the gradient there are exactly 0
    (0 * inf would be NaN).
    """
    return jnp.where(valid, x, jnp.zeros((), x.dtype))
