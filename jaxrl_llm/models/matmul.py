"""The decoder's projections x @ w in low precision, as dots whose inputs stay bfloat16 and whose
products accumulate in float32, in the forward and in both matmuls of the backward pass.

XLA:CPU (jaxlib 0.10) rewrites a bf16 x bf16 -> bf16 dot into converts to float32, a float32
dot and a convert back; a bf16 x bf16 -> float32 dot (``preferred_element_type=float32``) it
hands to YNNPACK as it is, whose kernels use the CPU's bf16 dot instructions (AVX512_BF16
``vdpbf16ps``) where it has them, so it runs faster than either the float32 dot or the converted
bf16 -> bf16 one (table in docs/benchmarks.md; ``benchmarks.bf16_dot``, removed in issue 33). JAX's own
transpose of such a dot takes the float32 cotangent, so the backward's dots would mix float32
and bf16 operands and fall back to float32; ``low_precision_matmul`` has a custom VJP whose
backward casts the cotangent to the input dtype first (what the plain bf16 dot's backward
computes with too) and again accumulates in float32. Results are rounded to the input dtype
once, after the float32 sum, so they are at least as exact as the bf16 dot's.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

# The name of low_precision_matmul's outputs for jax.checkpoint policies: a custom VJP hides its
# dot from ``dots_with_no_batch_dims_saveable``, so ``models.remat``'s "dots" mode saves this name too.
PROJECTION = "low_precision_projection"


def _accumulate_f32(a: jax.Array, b: jax.Array, contract: tuple[tuple[int, ...], tuple[int, ...]],
                    dtype) -> jax.Array:
    return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32).astype(dtype)


@jax.custom_vjp
def low_precision_matmul(x: jax.Array, w: jax.Array) -> jax.Array:
    """x[..., d] @ w[d, o] -> [..., o] in x's dtype, summed in float32 (x and w of one dtype)."""
    return _accumulate_f32(x, w, ((x.ndim - 1,), (0,)), x.dtype)


def _forward(x, w):
    return checkpoint_name(low_precision_matmul(x, w), PROJECTION), (x, w)


def _backward(residuals, grad):
    x, w = residuals
    grad = grad.astype(x.dtype)
    dx = _accumulate_f32(grad, w, ((grad.ndim - 1,), (1,)), x.dtype)  # dy @ w^T
    rows = tuple(range(x.ndim - 1))
    dw = _accumulate_f32(x, grad, (rows, rows), w.dtype)  # x^T @ dy over every leading axis
    return dx, dw


low_precision_matmul.defvjp(_forward, _backward)


def project(x: jax.Array, w: jax.Array) -> jax.Array:
    """x @ w: bfloat16 through ``low_precision_matmul`` (output named PROJECTION), other dtypes as they are."""
    if x.dtype != jnp.bfloat16 or w.dtype != jnp.bfloat16:
        return x @ w
    return checkpoint_name(low_precision_matmul(x, w), PROJECTION)


@jax.custom_vjp
def low_precision_logits(hidden: jax.Array, weight: jax.Array) -> jax.Array:
    """hidden[..., d] @ weight[v, d]^T -> float32 logits [..., v] (the tied LM head), operands of one
    low dtype. The backward casts the float32 logit gradient to that dtype for both of its matmuls
    (dh = g @ weight, dweight = g^T @ hidden, summed in float32), as ``low_precision_matmul`` does:
    without it XLA:CPU converts the whole [v, d] weight to float32 and runs both in float32."""
    return jax.lax.dot_general(hidden, weight, (((hidden.ndim - 1,), (1,)), ((), ())),
                               preferred_element_type=jnp.float32)


def _logits_forward(hidden, weight):
    return low_precision_logits(hidden, weight), (hidden, weight)


def _logits_backward(residuals, grad):
    hidden, weight = residuals
    grad = grad.astype(hidden.dtype)
    dhidden = _accumulate_f32(grad, weight, ((grad.ndim - 1,), (0,)), hidden.dtype)  # g @ weight
    rows = tuple(range(hidden.ndim - 1))
    dweight = _accumulate_f32(grad, hidden, (rows, rows), weight.dtype)  # g^T @ hidden
    return dhidden, dweight


low_precision_logits.defvjp(_logits_forward, _logits_backward)
