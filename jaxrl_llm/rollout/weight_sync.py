"""Moving the learner's parameters into running vLLM servers.

`WeightSync` is the strategy seam; `DiskWeightSync` is the implementation
that works everywhere (CPU and GPU, one or many servers on one host or on a
shared filesystem):

  1. export: the learner writes HF-format safetensors (via the bridge) into
     a staging directory, on /dev/shm when it exists (RAM, no disk): the
     directory of the push before last, rewritten in place (no new pages)
     through a memory map by several copy threads, which also transpose
     host-resident leaves to HF's layout as they copy.
  2. reload: POST /collective_rpc {"method": "reload_weights",
     "kwargs": {"weights_path": DIR}} to every server. vLLM loads the
     checkpoint-format tensors in place (fusing q/k/v and gate/up itself).
     Needs the server started with VLLM_SERVER_DEV_MODE=1. A mixture-of-experts
     export (its config.json names experts) is reloaded with the worker
     extension's "jaxrl_reload_weights" instead, which also repacks vLLM's CPU
     experts (vllm_worker/jaxrl_moe_reload.py: without it vLLM 0.32 CPU serves
     garbage after a MoE reload); VLLMServer loads that extension for MoE models.
  3. POST /reset_prefix_cache: cached KV blocks were computed by the old
     weights and must not be reused.
  4. POST /update_weight_version {"new_version": "<v>"}: vLLM's own label,
     readable at GET /weight_info, so a server can be asked what it serves.
  5. verify (optional, `LogprobProbe`): score a fixed token sequence with
     prompt logprobs on every server and compare with the learner's
     logprobs for the same params (computed during step 2's reload). Reloads that silently skip tensors (vLLM
     only logs a warning for weights it did not find) fail here.

`push` runs the five steps in line. `push_overlapped` returns after step 4 with a
`PendingPush` whose probe runs on a background thread, so the caller can start the
next rollout while it runs; `PendingPush.result()` waits for it and raises on a
mismatch. Whoever overlaps must not hand on anything the servers produced before
`result()` returned (`VLLMEngine(overlap_verify=True)` holds each batch back until
then). `push(p, v)` is `push_overlapped(p, v).result()`.

GPU fast path (not implemented here; same seam): vLLM 0.32 has an NCCL
weight-transfer API (server flag --weight-transfer-config '{"backend":
"nccl"}'). The trainer and the server workers form one NCCL group (trainer
rank 0): POST /init_weight_transfer_engine {"init_info": {...}} with either
a TCPStore rendezvous (master_address, master_port, world_size) or, for a
torch-free trainer such as JAX, an ncclUniqueId minted by the trainer
(nccl_unique_id_b64). Each update is POST /start_weight_update, POST
/update_weights {"update_info": {"names", "dtype_names", "shapes"}} while
the trainer broadcasts the tensors (HF names, packed buffers) from its GPUs,
then POST /finish_weight_update {"weight_version": "<v>"}. No file is
written. A `NcclWeightSync(WeightSync)` would implement `push` with those
calls (JAX device buffers reach NCCL via DLPack, or a small torch peer
process). CPU builds of vLLM have no NCCL backend, hence disk here.
"""
from __future__ import annotations

import abc
import concurrent.futures
import dataclasses
import os
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from jaxrl_llm.rollout.vllm_client import VLLMClient
from jaxrl_llm.rollout.vllm_server_config import is_moe_dir


class WeightSyncError(RuntimeError):
    """The servers did not end up serving the pushed weights."""


@dataclasses.dataclass(frozen=True)
class WeightSyncReport:
    """What one push did and how long each phase took (seconds)."""

    version: int
    weights_dir: str
    export_s: float
    reload_s: float
    verify_s: float
    probe_max_abs_diff: float | None  # max |vLLM - learner| over probe tokens and servers

    @property
    def total_s(self) -> float:
        return self.export_s + self.reload_s + self.verify_s


class PendingPush:
    """A push whose export and reload are done and whose verification may still run.

    The servers already serve version `version` (unverified until `result()` returns).
    `result()` waits for the probe and returns the push's WeightSyncReport, or raises the
    WeightSyncError of a mismatch (or whatever else stopped the probe, e.g. a server that
    died); every call returns or raises the same. `verify_s` of the report is the probe's
    own time after the reload, however long the caller took to ask.
    """

    def __init__(self, version: int, weights_dir: str, export_s: float, reload_s: float,
                 verified: concurrent.futures.Future):
        self.version = version
        self.weights_dir = weights_dir
        self.export_s = export_s
        self.reload_s = reload_s
        self._verified = verified  # -> (probe_max_abs_diff or None, verify_s)
        self.collected = False  # result() was called: its outcome reached a caller

    def done(self) -> bool:
        """Whether the probe has finished (result() will not wait)."""
        return self._verified.done()

    def wait(self) -> None:
        """Wait for the probe to finish, without raising its outcome."""
        concurrent.futures.wait([self._verified])

    def result(self, timeout_s: float | None = None) -> WeightSyncReport:
        self.collected = True
        diff, verify_s = self._verified.result(timeout_s)
        return WeightSyncReport(self.version, self.weights_dir, self.export_s, self.reload_s, verify_s, diff)


def _finished(value: Any) -> concurrent.futures.Future:
    future: concurrent.futures.Future = concurrent.futures.Future()
    future.set_result(value)
    return future


@dataclasses.dataclass(frozen=True)
class LogprobProbe:
    """Check that a server serves given params by scoring a fixed sequence.

    Attributes:
      token_ids: the probe sequence (>= 2 tokens; ~16-64 is plenty).
      learner_logprobs: params -> float [len(token_ids) - 1], the learner's
        log p(x_t | x_<t) for the probe at temperature 1 (e.g. a jitted
        jaxrl_llm.models.token_logprobs).
      atol: largest allowed |vLLM - learner| per token. It depends on the
        server dtype: ~1e-3 is safe for float32; bfloat16 needs ~0.3.
    """

    token_ids: Sequence[int]
    learner_logprobs: Callable[[Any], np.ndarray]
    atol: float

    def expected(self, params: Any) -> np.ndarray:
        return np.asarray(self.learner_logprobs(params), np.float64).reshape(-1)

    def max_abs_diff(self, client: VLLMClient, expected: np.ndarray) -> float:
        """max over servers and probe tokens of |served - expected|."""
        worst = 0.0
        for url in client.urls:
            served = client.prompt_logprobs(self.token_ids, url=url).astype(np.float64)
            if served.shape != expected.shape:
                raise WeightSyncError(f"probe shapes differ: server {served.shape}, learner {expected.shape}")
            worst = max(worst, float(np.max(np.abs(served - expected))))
        return worst


def reload_method(weights_dir: Path) -> str:
    """The /collective_rpc method that reloads `weights_dir`: vLLM's "reload_weights", or for a
    mixture-of-experts export the worker extension's "jaxrl_reload_weights" (see step 2 above)."""
    return "jaxrl_reload_weights" if is_moe_dir(weights_dir) else "reload_weights"


def bridge_export(cfg: Any, dtype: str = "float32", workers: int | None = None) -> Callable[[Any, Path], None]:
    """An `export` for DiskWeightSync: the bridge's sync writer (``write_sync_dir``): weights
    and config only, no fsync (a staging copy on /dev/shm need not survive a crash), an older
    copy in the directory rewritten in place, tensors written by ``workers`` threads (default:
    the CPU count, at most 4). `dtype` is the stored dtype; vLLM casts to its own --dtype on
    load, so float32 loses nothing and bfloat16 halves the bytes written and read."""
    from jaxrl_llm.bridge.hf_save import write_sync_dir  # rollout -> bridge, as the layering allows

    workers = workers if workers is not None else max(1, min(4, os.cpu_count() or 1))

    def export(params: Any, directory: Path) -> None:
        write_sync_dir(cfg, params, directory, dtype=dtype, workers=workers)

    return export


class WeightSync(abc.ABC):
    """Strategy that makes every server of a client serve new params."""

    @abc.abstractmethod
    def push(self, params: Any, version: int) -> WeightSyncReport:
        """Install params as weight version `version` on every server; raise
        WeightSyncError if that cannot be confirmed."""

    def push_overlapped(self, params: Any, version: int) -> PendingPush:
        """`push`, with whatever verification it does left running after the servers serve
        `params` (a strategy that cannot split its push verifies in line: the default)."""
        report = self.push(params, version)
        return PendingPush(version, report.weights_dir, report.export_s, report.reload_s,
                           _finished((report.probe_max_abs_diff, report.verify_s)))


def default_stage_root() -> Path:
    """/dev/shm (RAM-backed) when present, else the system temp dir."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return shm
    return Path(tempfile.gettempdir())


class DiskWeightSync(WeightSync):
    """Export to a staging directory, then have every server reload from it.

    Args:
      client: reaches the servers (all of client.urls are updated).
      export: (params, directory) -> None, fills `directory` with HF-format
        safetensors, e.g. `bridge_export(cfg)`. `directory` either does not
        exist yet or holds the files of an older push (see `reuse_staging`),
        which the export may overwrite in place or replace.
      stage_root: where staging directories go; default /dev/shm. With
        servers on other hosts this must be a filesystem they all see.
      probe: optional LogprobProbe run after the reload.
      rpc_timeout_s: read timeout of the reload call.
      reuse_staging: keep the directory of the push before last and hand it
        to the next export to overwrite: on /dev/shm rewriting existing pages
        skips the page allocation and zeroing a new file pays for every
        4 KiB. Costs a second staged copy of the weights in RAM.

    The newest staging directory is kept (the servers' model config points
    at it after a reload), plus with `reuse_staging` the one before it, which
    no server reads any more; older ones are deleted after a successful push,
    and everything on close() (or at exit if close() is never called).
    Usable as a context manager.
    """

    def __init__(self, client: VLLMClient, export: Callable[[Any, Path], None], *,
                 stage_root: str | Path | None = None, probe: LogprobProbe | None = None,
                 rpc_timeout_s: float = 600.0, reuse_staging: bool = True):
        self.client = client
        self.export = export
        self.stage_root = Path(stage_root) if stage_root is not None else default_stage_root()
        self.probe = probe
        self.rpc_timeout_s = rpc_timeout_s
        self.stage_root.mkdir(parents=True, exist_ok=True)
        self._stage_dir = Path(tempfile.mkdtemp(prefix="jaxrl-weights-", dir=self.stage_root))
        self.reuse_staging = reuse_staging
        self._current: Path | None = None
        self._spare: Path | None = None  # an older push's directory, rewritten by the next export
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="weight-sync-probe")
        self._pending: PendingPush | None = None  # the newest push, its probe perhaps still running
        # Staged weights are ~0.5 GB of RAM per copy on /dev/shm: removed on
        # close(), and at garbage collection or interpreter exit otherwise.
        self._remove_stage = weakref.finalize(self, shutil.rmtree, str(self._stage_dir), ignore_errors=True)

    def push(self, params: Any, version: int) -> WeightSyncReport:
        return self.push_overlapped(params, version).result()

    def push_overlapped(self, params: Any, version: int) -> PendingPush:
        """Export and reload in line (the servers serve `params` when this returns); the
        probe runs on a background thread: `result()` of the returned PendingPush waits
        for it and raises on a mismatch. The previous push's probe is waited for first
        (its request must not meet this reload), and raised here if it failed and its
        result() was never called."""
        previous = self._pending
        if previous is not None:
            previous.wait()
            if not previous.collected:
                previous.result()  # raises a failure nobody has seen
        weights_dir = self._stage_dir / f"v{version}"
        try:
            pending = self._export_and_reload(params, version, weights_dir)
        except BaseException:
            if weights_dir != self._current:  # failed pushes must not pile up 0.5 GB copies
                shutil.rmtree(weights_dir, ignore_errors=True)
            shutil.rmtree(self._stage_dir / f".v{version}.partial", ignore_errors=True)
            raise
        # The servers now read weights_dir whatever the probe says: the directory before it
        # becomes the spare that the next export rewrites.
        previous_dir, self._current = self._current, weights_dir
        if previous_dir is not None and previous_dir != weights_dir:
            if self.reuse_staging:
                self._spare = previous_dir
            else:
                shutil.rmtree(previous_dir, ignore_errors=True)
        self._pending = pending
        return pending

    def _export_and_reload(self, params: Any, version: int, weights_dir: Path) -> PendingPush:
        started = time.perf_counter()
        partial = self._stage_dir / f".v{version}.partial"
        shutil.rmtree(partial, ignore_errors=True)
        if self._spare is not None:  # no server reads it: the export overwrites it in place
            spare, self._spare = self._spare, None
            if spare.is_dir():
                spare.rename(partial)
        self.export(params, partial)
        if not partial.is_dir() or not any(partial.glob("*.safetensors")):
            found = sorted(p.name for p in partial.iterdir()) if partial.is_dir() else "no directory"
            raise WeightSyncError(f"export wrote no *.safetensors into {partial} (found: {found})")
        shutil.rmtree(weights_dir, ignore_errors=True)
        partial.rename(weights_dir)  # servers only ever see a complete directory
        exported = time.perf_counter()

        # The learner's probe logprobs need only params: computed while the servers reload
        # (this process only waits then), not during the export, whose writer threads they
        # would slow down on a small CPU (JAX releases the GIL).
        expected = self._pool.submit(self.probe.expected, params) if self.probe is not None else None
        self.client.post_all("/collective_rpc", {"method": reload_method(weights_dir),
                                                 "kwargs": {"weights_path": str(weights_dir)}},
                             timeout_s=self.rpc_timeout_s)
        self.client.post_all("/reset_prefix_cache")
        self.client.post_all("/update_weight_version", {"new_version": str(version)})
        reloaded = time.perf_counter()
        if expected is None:
            verified = _finished((None, 0.0))
        else:  # the pool's one thread runs `expected` first, then this
            verified = self._pool.submit(self._verify, expected, version, weights_dir, reloaded)
        return PendingPush(version, str(weights_dir), exported - started, reloaded - exported, verified)

    def _verify(self, expected: concurrent.futures.Future, version: int, weights_dir: Path,
                reloaded: float) -> tuple[float, float]:
        """(max |served - learner|, seconds from the reload's end): the probe after a reload."""
        diff = self.probe.max_abs_diff(self.client, expected.result())
        if not diff <= self.probe.atol:
            raise WeightSyncError(
                f"after reloading version {version} from {weights_dir}, the servers' probe logprobs "
                f"differ from the learner's by up to {diff:.4g} (allowed {self.probe.atol}); the "
                "export is incomplete, misnamed, or in a different dtype than expected")
        return diff, time.perf_counter() - reloaded

    def close(self) -> None:
        """Delete every staged directory (the servers keep serving the loaded weights)."""
        self._pool.shutdown(wait=True)
        self._remove_stage()

    def __enter__(self) -> "DiskWeightSync":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
