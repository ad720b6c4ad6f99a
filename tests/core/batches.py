"""Random step batches for the core tests (numpy, float32, prompt-major rows)."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Batch(NamedTuple):
    rewards: np.ndarray  # [P, G]
    mask: np.ndarray  # [N, T] float32, right-padded
    logp: np.ndarray  # [N, T] current policy
    old_logp: np.ndarray  # [N, T]
    sampler_logp: np.ndarray  # [N, T]
    values: np.ndarray  # [N, T]


def lengths_to_mask(lengths, width: int) -> np.ndarray:
    return (np.arange(width)[None, :] < np.asarray(lengths)[:, None]).astype(np.float32)


def random_batch(seed: int, num_prompts: int = 4, group_size: int = 4, width: int = 8,
                 *, binary_rewards: bool = True, lengths=None) -> Batch:
    rng = np.random.default_rng(seed)
    n = num_prompts * group_size
    if binary_rewards:
        rewards = rng.integers(0, 2, (num_prompts, group_size)).astype(np.float32)
    else:
        rewards = rng.normal(size=(num_prompts, group_size)).astype(np.float32)
    if lengths is None:
        lengths = rng.integers(0, width + 1, n)
    mask = lengths_to_mask(lengths, width)
    old_logp = np.log(rng.uniform(0.05, 1.0, (n, width))).astype(np.float32)
    logp = (old_logp + rng.normal(0.0, 0.3, (n, width))).astype(np.float32)
    sampler_logp = (old_logp + rng.normal(0.0, 0.2, (n, width))).astype(np.float32)
    values = rng.normal(size=(n, width)).astype(np.float32)
    return Batch(rewards, mask, logp, old_logp, sampler_logp, values)


def poison_padding(x: np.ndarray, mask: np.ndarray, value=np.nan) -> np.ndarray:
    """x with NaN (or `value`) written into every padded position."""
    return np.where(mask != 0, x, value).astype(x.dtype)
