"""The routed experts a vLLM server recorded, as the client reads them (routing replay: the
learner reuses the experts the sampler chose; R3, Ma et al. 2025, arXiv 2510.11370).

The server side is `vllm_worker/jaxrl_routing_capture.py` (a worker extension, see there why not
vLLM's own --enable-return-routed-experts). A sampling request names a fresh key in its
`vllm_xargs`; after the answer, /collective_rpc `jaxrl_take_routed_experts(key)` returns, per
sample index, the rows from position `start` as a base64 .npy int16 array
[rows, num_layers, top_k]. `decode_routed_experts` checks them against the sample: start 0 and
P + L - 1 rows (every token but the last sampled one, which is never forwarded).
"""
from __future__ import annotations

import base64
import io
from typing import Any, Mapping, Sequence

import numpy as np

ROUTING_KEY_ARG = "jaxrl_routing_key"  # the vllm_xargs entry the worker extension files rows under
INSTALL_METHOD = "jaxrl_install_routing_capture"
TAKE_METHOD = "jaxrl_take_routed_experts"
OPTION = "return_routed_experts"
HOW_TO_START = (f"start the server with VLLMServerConfig({OPTION}=True) (config rollout.{OPTION}) "
                "and a mixture-of-experts model")


class RoutedExpertsError(RuntimeError):
    """Routed experts were asked for but cannot be had, or came back inconsistent."""


def worker_results(answers: Sequence[Any], urls: Sequence[str], method: str) -> list[dict]:
    """The per-worker dicts of /collective_rpc answers (one answer per server); a worker's
    {"error": ...} is raised naming its server."""
    out = []
    for url, answer in zip(urls, answers):
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            raise RoutedExpertsError(f"{OPTION}: server {url} answered {method} with {str(answer)[:200]!r}, not "
                                     f"a list of dicts; {HOW_TO_START}")
        for result in results:
            if "error" in result:
                raise RoutedExpertsError(f"{OPTION}: server {url}: {result['error']}")
        out += results
    return out


def merge_taken(results: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """sample index -> its entry, over all workers (tensor-parallel ranks record the same rows)."""
    return {int(index): entry for result in results for index, entry in result.items()}


def decode_routed_experts(entry: Mapping[str, Any] | None, prompt_len: int, completion_len: int,
                          sample: str) -> np.ndarray:
    """int32 [P + L - 1, num_layers, top_k] from one taken entry; raises RoutedExpertsError when
    it is missing or does not cover exactly the tokens the sampler forwarded."""
    if entry is None:
        raise RoutedExpertsError(f"{OPTION}: the server recorded no routed experts for {sample}; {HOW_TO_START}")
    with io.BytesIO(base64.b64decode(entry["npy_b64"])) as buffer:
        rows = np.load(buffer, allow_pickle=False)
    want = prompt_len + completion_len - 1
    if int(entry["start"]) != 0 or rows.ndim != 3 or rows.shape[0] != want:
        raise RoutedExpertsError(
            f"{OPTION}: {sample} has routed experts for positions {entry['start']}..{entry['start'] + len(rows) - 1} "
            f"(shape {rows.shape}), expected 0..{want - 1}: one row per forwarded token of its {prompt_len} prompt "
            f"and {completion_len} completion tokens (was the prompt served from the prefix cache?)")
    return rows.astype(np.int32)
