"""Several rollout engines as one (`RolloutPool`): each samples a contiguous chunk of the prompts."""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams


class RolloutPool:
    """Several rollout engines as one: prompts are split into contiguous chunks, one per
    engine, sampled concurrently and merged in order; weights go to every engine.

    `VLLMClient(urls)` already spreads one engine's requests round-robin over several
    servers behind one version counter; this pool is for engines that are separate
    objects (several JaxSamplers on different devices, several VLLMEngines with their own
    weight syncs). Chunk c is seeded with seed + c * 1_000_003 so it draws its own samples.
    """

    def __init__(self, engines: Sequence[Any]):
        if not engines:
            raise ValueError("RolloutPool needs at least one engine, got none")
        versions = {int(e.weight_version) for e in engines}
        if len(versions) != 1:
            raise ValueError(f"engines hold different weight versions {sorted(versions)}; start them from one")
        self.engines = list(engines)
        self._pool = ThreadPoolExecutor(len(self.engines), thread_name_prefix="rollout-pool")

    @property
    def weight_version(self) -> int:
        return int(self.engines[0].weight_version)

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int, params: SamplingParams) -> RolloutBatch:
        prompts = list(prompts_token_ids)
        chunks = [c for c in _contiguous_chunks(len(prompts), len(self.engines)) if c.stop > c.start]

        def run(index: int, rows: slice) -> RolloutBatch:
            seed = None if params.seed is None else params.seed + index * 1_000_003
            return self.engines[index].generate(prompts[rows], n=n, params=dataclasses.replace(params, seed=seed))

        parts = list(self._pool.map(run, range(len(chunks)), chunks))
        records = []
        for rows, part in zip(chunks, parts):
            for rec in part.records:
                records.append(dataclasses.replace(rec, prompt_index=rec.prompt_index + rows.start))
        return RolloutBatch(tuple(records), num_prompts=len(prompts), samples_per_prompt=n)

    def update_weights(self, params: Any) -> int:
        versions = set(self._pool.map(lambda e: int(e.update_weights(params)), self.engines))
        if len(versions) != 1:
            raise RuntimeError(f"engines disagree on the weight version after an update: {sorted(versions)}")
        return versions.pop()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _contiguous_chunks(total: int, parts: int) -> list[slice]:
    base, extra = divmod(total, parts)
    bounds = [0]
    for i in range(parts):
        bounds.append(bounds[-1] + base + (1 if i < extra else 0))
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
