"""Rotary position embeddings (Su et al. 2021, RoFormer) in HF's "rotate_half" layout, with the
"linear" and Llama 3.1 "llama3" frequency rescalings (``decoder.py`` describes the formula)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_llm.models.config import DecoderConfig


def rope_inverse_frequencies(cfg: DecoderConfig) -> np.ndarray:
    """f_i = theta^(-2i/hd), i < hd/2, rescaled for 'linear' (f / factor) or 'llama3'
    (Llama 3.1: wavelengths above L/low_freq_factor divided by factor, below
    L/high_freq_factor kept, linear blend in between; L = original context)."""
    dim = cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq.astype(np.float32)
    if scaling.rope_type == "linear":
        return (inv_freq / scaling.factor).astype(np.float32)
    context = scaling.original_max_position_embeddings
    wavelength = 2 * np.pi / inv_freq
    smooth = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
    scaled = np.where(wavelength > context / scaling.low_freq_factor, inv_freq / scaling.factor, blended)
    scaled = np.where(wavelength < context / scaling.high_freq_factor, inv_freq, scaled)
    return scaled.astype(np.float32)


def apply_rope(x: jax.Array, positions: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate x [B, T, H, hd] by angle positions[b, t] * inv_freq (rotate_half layout), in float32."""
    angles = positions.astype(jnp.float32)[:, :, None] * jnp.asarray(inv_freq)[None, None, :]
    angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, hd]
    x32 = x.astype(jnp.float32)
    x1, x2 = jnp.split(x32, 2, axis=-1)
    rotated = jnp.concatenate([-x2, x1], axis=-1)
    return (x32 * jnp.cos(angles) + rotated * jnp.sin(angles)).astype(x.dtype)
