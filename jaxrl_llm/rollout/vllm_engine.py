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

With `overlap_verify=True`, `update_weights` returns once the servers serve the new
weights (export + reload) and their verification (the weight sync's logprob probe)
runs in the background; the next `generate` samples meanwhile but waits for the probe
before its batch leaves (`last_verify_wait_s`). A failed probe discards that batch
(`UnverifiedWeightsError`, naming the mismatch) and every later `generate` refuses until
`update_weights` installs other weights: no batch from weights that failed, or were never
checked, is ever returned.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Sequence

from jaxrl_llm.rollout.types import RolloutBatch, RolloutRecord, SamplingParams
from jaxrl_llm.rollout.vllm_client import VLLMClient, VLLMUnavailableError
from jaxrl_llm.rollout.vllm_server import VLLMServer, VLLMServerError
from jaxrl_llm.rollout.weight_sync import PendingPush, WeightSync, WeightSyncError, WeightSyncReport


class UnverifiedWeightsError(WeightSyncError):
    """The weights a batch was (or would be) sampled from failed their verification."""


class VLLMEngine:
    """Rollout engine backed by one or more vLLM servers.

    Args:
      client: VLLMClient over the servers' URLs.
      weight_sync: how update_weights reaches the servers (None: read-only
        engine; update_weights raises).
      servers: the VLLMServer objects this process launched, if any; when a
        request fails, a dead one is reported with its exit code and log.
      initial_version: version of the weights the servers started with.
      overlap_verify: update_weights leaves the push's verification running and the
        next generate waits for it before returning its batch (see the module doc).

    Attributes:
      last_sync: the report of the newest push whose verification has finished.
      last_verify_wait_s: how long the latest generate waited, after sampling, for the
        verification of the weights it sampled from (0 without overlap_verify).
    """

    def __init__(self, client: VLLMClient, weight_sync: WeightSync | None = None, *,
                 servers: Sequence[VLLMServer] = (), initial_version: int = 0, overlap_verify: bool = False):
        self.client = client
        self.weight_sync = weight_sync
        self.servers = list(servers)
        self.overlap_verify = bool(overlap_verify)
        self._version = int(initial_version)
        self._lock = threading.Lock()
        self._pending: PendingPush | None = None  # the served weights' verification, still to collect
        self._failure: Exception | None = None  # why the served weights must not be sampled from
        self.last_sync: WeightSyncReport | None = None
        self.last_verify_wait_s = 0.0

    @property
    def weight_version(self) -> int:
        return self._version

    def generate(self, prompts_token_ids: Sequence[Sequence[int]], n: int,
                 params: SamplingParams) -> RolloutBatch:
        with self._lock:
            self._refuse_failed()
            version = self._version
            try:
                samples = self.client.sample(prompts_token_ids, n, params)
            except VLLMUnavailableError as err:
                raise self._explain(err) from err
            started = time.perf_counter()
            try:
                self._collect_verification()
            except Exception as err:
                raise UnverifiedWeightsError(
                    f"a batch of {sum(map(len, samples))} samples from weight version {version} was discarded: "
                    f"those weights failed verification: {err}") from err
            finally:
                self.last_verify_wait_s = time.perf_counter() - started
        records = [
            RolloutRecord(prompt_index=p, sample_index=j, prompt_token_ids=prompts_token_ids[p],
                          completion_token_ids=s.token_ids, sampler_logprobs=s.logprobs,
                          finish_reason=s.finish_reason, weight_version=version, routed_experts=s.routed_experts)
            for p, group in enumerate(samples) for j, s in enumerate(group)
        ]
        return RolloutBatch(tuple(records), num_prompts=len(samples), samples_per_prompt=n)

    def update_weights(self, params: Any) -> int:
        """Push `params` as the next version. Without overlap_verify the push is verified
        before this returns; with it, only installed (the next generate waits for the
        verification). A verification failure nobody has collected yet is raised here."""
        if self.weight_sync is None:
            raise RuntimeError("this VLLMEngine has no weight_sync; construct it with e.g. DiskWeightSync")
        with self._lock:
            self._collect_verification()  # the previous push's probe must not meet this reload
            new_version = self._version + 1
            try:
                if self.overlap_verify:
                    self._pending = self.weight_sync.push_overlapped(params, new_version)
                else:
                    self.last_sync = self.weight_sync.push(params, new_version)
            except VLLMUnavailableError as err:
                raise self._explain(err) from err
            self._version = new_version
            self._failure = None  # other weights now: generate may sample again
        return new_version

    def wait_verified(self) -> WeightSyncReport | None:
        """Wait for the newest push's verification and raise if it failed (now or before);
        its report (None before any push). Does not take the engine's lock, so a generate
        already sampling goes on meanwhile."""
        pending, failure = self._pending, self._failure  # _failure is set before _pending is cleared
        if pending is not None:
            return pending.result()
        if failure is not None:
            raise failure
        return self.last_sync

    def _collect_verification(self) -> None:
        """Wait for the pending push's verification; on failure remember it (generate then
        refuses) and raise it."""
        pending = self._pending
        if pending is None:
            return
        try:
            self.last_sync = pending.result()
        except VLLMUnavailableError as err:
            self._failure = self._explain(err)
            raise self._failure from err
        except Exception as err:
            self._failure = err
            raise
        finally:
            self._pending = None

    def _refuse_failed(self) -> None:
        if self._failure is not None:
            raise UnverifiedWeightsError(
                f"refusing to sample: the served weights (version {self._version}) failed verification "
                f"({type(self._failure).__name__}: {self._failure}); push other weights with update_weights first")

    def close(self) -> None:
        """Release the weight sync's staged files and the client's threads
        (servers are stopped by whoever started them)."""
        pending, self._pending = self._pending, None
        if pending is not None:  # its outcome has no taker any more; only let the probe finish
            pending.wait()
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
