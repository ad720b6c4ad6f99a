"""`RolloutEngine` over vLLM servers: the client samples, a `WeightSync`
installs new weights, and a version counter labels every record.

    with VLLMServer(VLLMServerConfig(model_dir=hf_dir)) as server:
        client = VLLMClient([server.url])
        sync = DiskWeightSync(client, export=lambda p, d: save_hf_dir(p, cfg, d))
        engine = VLLMEngine(client, sync, servers=[server])
        batch = engine.generate(prompt_ids, n=8, params=SamplingParams(max_tokens=64))
        engine.update_weights(new_params)   # next batches carry weight_version 1

`generate` and `update_weights` exclude each other (one lock), so every
record of a batch was sampled by exactly the weights its version names.
"""
from __future__ import annotations

import threading
from typing import Any, Sequence

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord, SamplingParams
from jaxrl_llm.rollout.vllm_client import VLLMClient, VLLMUnavailableError
from jaxrl_llm.rollout.vllm_server import VLLMServer, VLLMServerError
from jaxrl_llm.rollout.weight_sync import WeightSync, WeightSyncReport


class VLLMEngine:
    """Rollout engine backed by one or more vLLM servers.

    Args:
      client: VLLMClient over the servers' URLs.
      weight_sync: how update_weights reaches the servers (None: read-only
        engine; update_weights raises).
      servers: the VLLMServer objects this process launched, if any; when a
        request fails, a dead one is reported with its exit code and log.
      initial_version: version of the weights the servers started with.
    """

    def __init__(self, client: VLLMClient, weight_sync: WeightSync | None = None, *,
                 servers: Sequence[VLLMServer] = (), initial_version: int = 0):
        self.client = client
        self.weight_sync = weight_sync
        self.servers = list(servers)
        self._version = int(initial_version)
        self._lock = threading.Lock()
        self.last_sync: WeightSyncReport | None = None

    @property
    def weight_version(self) -> int:
        return self._version

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int,
                 params: SamplingParams) -> RolloutBatch:
        with self._lock:
            version = self._version
            try:
                samples = self.client.sample(prompts_token_ids, n, params)
            except VLLMUnavailableError as err:
                raise self._explain(err) from err
        records = [
            RolloutRecord(prompt_index=p, sample_index=j, prompt_token_ids=prompts_token_ids[p],
                          completion_token_ids=s.token_ids, sampler_logprobs=s.logprobs,
                          finish_reason=s.finish_reason, weight_version=version)
            for p, group in enumerate(samples) for j, s in enumerate(group)
        ]
        return RolloutBatch(tuple(records), num_prompts=len(samples), samples_per_prompt=n)

    def update_weights(self, params: Any) -> int:
        if self.weight_sync is None:
            raise RuntimeError("this VLLMEngine has no weight_sync; construct it with e.g. DiskWeightSync")
        with self._lock:
            new_version = self._version + 1
            try:
                self.last_sync = self.weight_sync.push(params, new_version)
            except VLLMUnavailableError as err:
                raise self._explain(err) from err
            self._version = new_version
        return new_version

    def close(self) -> None:
        """Release the weight sync's staged files and the client's threads
        (servers are stopped by whoever started them)."""
        close_sync = getattr(self.weight_sync, "close", None)
        if close_sync is not None:
            close_sync()
        self.client.close()

    def __enter__(self) -> "VLLMEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _explain(self, err: Exception) -> Exception:
        """Name a crashed server, when we own it: its exit code and the
        exception from its log that killed it, instead of a bare connection
        error. A server whose engine died while its API process still runs
        answers /health with 503 and counts as crashed too."""
        started = [s for s in self.servers if s.process is not None]
        dead = [s for s in started if s.has_exited(within_s=2.0) or not s.is_healthy()]
        if not dead:
            return err
        return VLLMServerError("\n".join(["vLLM server died: " + "; ".join(map(_death_summary, dead)),
                                          f"client error: {err}"]
                                         + [f"log {s.log_path}, last lines:\n{s.log_tail(15)}" for s in dead]))


def _death_summary(server: VLLMServer) -> str:
    """'<url> exited with code C: <exception line>' in one line."""
    code = server.process.poll() if server.process else None
    state = f"exited with code {code}" if code is not None else "is running but unhealthy (engine dead)"
    cause = server.crash_cause() or "no exception in its log (killed by a signal or the OOM killer?)"
    return f"server {server.url} {state}: {cause}"
