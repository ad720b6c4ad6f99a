"""Asynchronous rollouts: a producer thread samples step k+1 while the learner trains on step k.

Timeline with max_lag = 1 (G = generate, L = learn, P = publish weights):

    producer  G1(v0) G2(v0)       G3(v1)       G4(v2) ...
    learner          L1 P(v1)     L2 P(v2)     L3 ...

Fixed staleness. The learner's params at step k are version v0 + (k - k0) - 1
(k0 the first step of the session); the batch of step k is sampled with exactly
version max(v0, v0 + (k - k0) - max_lag): before sampling it the producer waits until
that version is published, and `publish` of the next version waits until every batch
that needs the current one has been sampled. So the producer is never more than
`max_lag` versions ahead, the queue never holds more than max_lag + 1 batches, and
which weights sample which step does not depend on timing: a run is reproducible
(seeded sampler) whatever the relative speed of sampling and learning. max_lag = 0 is
the synchronous loop (every batch on-policy up to sampler numerics).

Resume. The batches of steps s+1..s+max_lag were sampled by weights older than the
checkpoint of step s holds; `unconsumed_batches` gives them to the checkpoint and the
resumed producer takes them back (`replay`) instead of sampling those steps again, so a
resumed asynchronous run continues exactly as the uninterrupted one.

Versions are exact. The engine is used under one lock (generate vs
update_weights), so every record of a batch was drawn by the weights its
`weight_version` names; `ProducedBatch.weight_version` is that version.

Correction of the staleness. The learner recomputes pi_old with its *current*
params (version v0 + k - k0 - 1), so the PPO ratio pi_theta / pi_old keeps its
trust region around the current policy, and the gap between pi_old and the
behaviour policy mu (stale weights + sampler numerics) is corrected by an
importance weight on every token: token TIS, w_t = min(pi_old(y_t) / mu(y_t), C)
(`core.token_tis`; Yao et al. 2025, "Your efficient RL framework secretly brings
you off-policy RL training"). Objective:

    L = - sum_t w_agg_t * min(pi_old/mu, C) * clip-PPO(pi_theta / pi_old, A_t)

the decoupled PPO objective of Hilton et al. 2021 ("Batch size-invariance for
policy optimization", arXiv 2110.00641), used for asynchronous RL by AReaL
(Fu et al. 2025, arXiv 2505.24298). `staleness_corrected` puts token TIS (cap
C = 2) into a recipe that has no correction; `core.prepare_step_batch` then
computes the weights from the batch's sampler logprobs (`learn.learn` passes them).

The RL loop (`loop.train`) always takes its batches from an AsyncRolloutProducer;
`rollout.max_lag` in the config picks synchronous (0) or asynchronous (>= 1) mode.

Exact accounting. Each sample has an id "step:prompt:sample"; the `SampleLedger`
records every id produced, consumed (handed to the learner, at most once) and
dropped (produced but never consumed, e.g. the batches in flight at shutdown).
At the end produced = consumed + dropped, disjointly.
"""
from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
from typing import Any, Callable, Sequence

from jaxrl_llm import core
from jaxrl_llm.rollout.types import RolloutBatch, SamplingParams


# ---------------------------------------------------------------- accounting
class SampleAccountingError(RuntimeError):
    """A sample id was produced twice, consumed twice, or consumed/dropped without being produced."""


class SampleLedger:
    """Thread-safe sets of sample ids: produced, consumed, dropped."""

    def __init__(self):
        self._lock = threading.Lock()
        self.produced: set[str] = set()
        self.consumed: set[str] = set()
        self.dropped: set[str] = set()

    def add_produced(self, ids: Sequence[str]) -> None:
        with self._lock:
            again = self.produced.intersection(ids)
            if again or len(set(ids)) != len(ids):
                raise SampleAccountingError(f"sample ids produced twice: {sorted(again)[:5] or 'within one batch'}")
            self.produced.update(ids)

    def _settle(self, ids: Sequence[str], into: set[str], what: str) -> None:
        with self._lock:
            unknown = set(ids) - self.produced
            settled = set(ids) & (self.consumed | self.dropped)
            if unknown:
                raise SampleAccountingError(f"{what} ids that were never produced: {sorted(unknown)[:5]}")
            if settled:
                state = "consumed" if settled & self.consumed else "dropped"
                raise SampleAccountingError(f"{what} ids already {state}: {sorted(settled)[:5]}")
            into.update(ids)

    def consume(self, ids: Sequence[str]) -> None:
        self._settle(ids, self.consumed, "consumed")

    def drop(self, ids: Sequence[str]) -> None:
        self._settle(ids, self.dropped, "dropped")

    def check_balanced(self) -> None:
        """Raise unless every produced id was consumed or dropped, exactly once."""
        with self._lock:
            missing = self.produced - self.consumed - self.dropped
            if missing:
                raise SampleAccountingError(f"{len(missing)} produced samples neither consumed nor dropped, "
                                            f"e.g. {sorted(missing)[:5]}")

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {"produced": len(self.produced), "consumed": len(self.consumed), "dropped": len(self.dropped)}


def sample_ids(step: int, rollouts: RolloutBatch) -> tuple[str, ...]:
    return tuple(f"{step}:{r.prompt_index}:{r.sample_index}" for r in rollouts.records)


# ------------------------------------------------------------------- batches
@dataclasses.dataclass(frozen=True)
class RolloutJob:
    """What to sample for one step. `context` travels to the consumer untouched (e.g. the examples)."""

    step: int
    prompts: Sequence[Sequence[int]]
    n: int
    params: SamplingParams
    context: Any = None


@dataclasses.dataclass(frozen=True)
class SampledBatch:
    """The rollouts of one step as the engine returned them, before postprocessing."""

    step: int
    weight_version: int
    rollouts: RolloutBatch
    extra: Any = None  # what a `sample` hook returned with the rollouts; None: `postprocess` runs


@dataclasses.dataclass(frozen=True)
class ProducedBatch:
    step: int
    rollouts: RolloutBatch
    weight_version: int  # version of the weights that sampled every record
    ids: tuple[str, ...]
    context: Any
    extra: Any  # what `postprocess` returned (e.g. rewards), None without one
    time_generate_s: float


class AsyncRolloutProducer:
    """Samples the batches of steps first_step..last_step in a background thread.

    Args:
      engine: a RolloutEngine (JaxSampler, VLLMEngine, RolloutPool, ...). Only this object
        calls its generate/update_weights once started.
      make_job: step -> RolloutJob.
      first_step, last_step: inclusive step range of this session.
      max_lag: most policy versions a batch may lag behind the learner (0 = synchronous).
      postprocess: optional (job, rollouts, with_engine) -> extra, run in the producer thread
        outside the engine's lock (e.g. grading); `with_engine` is `self.with_engine`.
      sample: optional (engine, job) -> (rollouts, extra) replacing generate + postprocess, run
        while the producer holds the engine (e.g. several graded rounds of dynamic sampling,
        all drawn by one weight version).
      replay: step -> SampledBatch sampled before a restart (from `unconsumed_batches` of the
        interrupted session): used as is for those steps instead of sampling them again.
    """

    def __init__(self, engine, make_job: Callable[[int], RolloutJob], *, first_step: int, last_step: int,
                 max_lag: int, postprocess: Callable[[RolloutJob, RolloutBatch, Callable], Any] | None = None,
                 sample: Callable[[Any, RolloutJob], tuple[RolloutBatch, Any]] | None = None,
                 replay: dict[int, SampledBatch] | None = None):
        if not isinstance(max_lag, int) or isinstance(max_lag, bool) or max_lag < 0:
            raise ValueError(f"max_lag={max_lag!r} is invalid; valid: an int >= 0 (0 = synchronous)")
        if last_step < first_step:
            raise ValueError(f"last_step={last_step} must be >= first_step={first_step}")
        self.engine = engine
        self.make_job = make_job
        self.first_step, self.last_step, self.max_lag = int(first_step), int(last_step), max_lag
        self.postprocess = postprocess
        self.sample = sample
        self.replay = dict(replay or {})
        self.ledger = SampleLedger()
        self.base_version = int(engine.weight_version)
        self._published = self.base_version
        self._engine_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: queue.Queue[ProducedBatch] = queue.Queue()
        self._stop = False
        self._error: BaseException | None = None
        self._failure_seen = False
        self._next_consume = self.first_step
        self._in_flight = 0  # produced, not yet consumed
        self._sampled: dict[int, SampledBatch] = {}  # sampled, not yet consumed
        self._sampled_through = self.first_step - 1  # last step whose sampling is done
        self.max_in_flight = 0  # largest number of batches ahead of the learner, for tests and metrics
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)

    # ----------------------------------------------------------- producer side
    def start(self) -> "AsyncRolloutProducer":
        self._thread.start()
        return self

    def required_version(self, step: int) -> int:
        """Oldest weight version the batch of `step` may be sampled with."""
        return self.base_version + (step - self.first_step) - self.max_lag

    def _run(self) -> None:
        try:
            for step in range(self.first_step, self.last_step + 1):
                job = self.make_job(step)
                t0 = time.perf_counter()
                sampled = self.replay.pop(step, None) or self._sample(job)
                if sampled is None:
                    return  # closed
                with self._cond:
                    self._sampled[step] = sampled
                    self._sampled_through = step
                    self._cond.notify_all()
                elapsed = time.perf_counter() - t0
                extra = sampled.extra
                if extra is None and self.postprocess:
                    extra = self.postprocess(job, sampled.rollouts, self.with_engine)
                batch = ProducedBatch(step, sampled.rollouts, sampled.weight_version,
                                      sample_ids(step, sampled.rollouts), job.context, extra, elapsed)
                self.ledger.add_produced(batch.ids)
                with self._cond:
                    self._in_flight += 1
                    self.max_in_flight = max(self.max_in_flight, self._in_flight)
                self._queue.put(batch)
        except BaseException as err:  # surfaced to the learner in next_batch
            self._error = err
            with self._cond:
                self._cond.notify_all()  # wake a publish waiting for this producer
            self._queue.put(None)  # wake a waiting consumer

    def _sample(self, job: RolloutJob) -> SampledBatch | None:
        """The engine's batch for `job`, once the learner has published the version it needs
        (None if the producer is closed while waiting)."""
        with self._cond:
            self._cond.wait_for(lambda: self._stop or self._published >= self.required_version(job.step))
            if self._stop:
                return None
        extra = None
        with self._engine_lock:
            version = int(self.engine.weight_version)
            if self.sample is None:
                rollouts = self.engine.generate(job.prompts, n=job.n, params=job.params)
            else:
                rollouts, extra = self.sample(self.engine, job)
        labels = set(rollouts.weight_versions.tolist())
        if labels != {version}:
            raise RuntimeError(f"step {job.step}: engine labelled records with versions {sorted(labels)} "
                               f"but held version {version} while sampling")
        return SampledBatch(job.step, version, rollouts, extra)

    def unconsumed_batches(self) -> list[SampledBatch]:
        """The batches sampled but not yet handed to the learner, by step (what a checkpoint
        must carry for a resumed run to go on exactly)."""
        with self._cond:
            return [self._sampled[s] for s in sorted(self._sampled)]

    # ----------------------------------------------------------- learner side
    @property
    def learner_version(self) -> int:
        """Version of the weights the learner holds (the last one it published)."""
        return self._published

    def next_batch(self, timeout_s: float | None = None) -> ProducedBatch:
        """The batch of the next step, in order; each batch is handed out once."""
        if self._next_consume > self.last_step:
            raise RuntimeError(f"all batches of steps {self.first_step}..{self.last_step} were consumed")
        # Batches produced before a failure are still handed out; the failure comes after them.
        if self._failure_seen:
            raise self._failure() from self._error
        if self._stop:
            raise RuntimeError("the rollout producer was closed; its unconsumed batches were dropped")
        try:
            batch = self._queue.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"no batch for step {self._next_consume} within {timeout_s} s") from None
        if batch is None:
            self._failure_seen = True
            raise self._failure() from self._error
        if batch.step != self._next_consume:
            raise RuntimeError(f"expected the batch of step {self._next_consume}, got step {batch.step}")
        lag = self.learner_version - batch.weight_version
        if not 0 <= lag <= self.max_lag:
            raise RuntimeError(f"step {batch.step}: batch of version {batch.weight_version} is {lag} versions behind "
                               f"the learner's {self.learner_version}; max_lag={self.max_lag}")
        self.ledger.consume(batch.ids)
        with self._cond:
            self._in_flight -= 1
            self._sampled.pop(batch.step, None)
        self._next_consume += 1
        return batch

    def _failure(self) -> RuntimeError:
        return RuntimeError(f"the rollout producer failed: {type(self._error).__name__}: {self._error}")

    def staleness(self, batch: ProducedBatch) -> int:
        return self.learner_version - batch.weight_version

    def publish(self, params: Any) -> int:
        """Install the learner's new params in the engine, once every batch that needs the
        current version is sampled; unblocks the producer."""
        with self._cond:
            needed = min(self.last_step, self._published - self.base_version + self.first_step + self.max_lag)
            self._cond.wait_for(lambda: self._stop or self._error is not None or self._sampled_through >= needed)
        with self._engine_lock:
            version = int(self.engine.update_weights(params))
        with self._cond:
            self._published = version
            self._cond.notify_all()
        return version

    def with_engine(self, fn: Callable[[Any], Any]) -> Any:
        """fn(engine) while no rollout or weight update runs (e.g. an evaluation between steps)."""
        with self._engine_lock:
            return fn(self.engine)

    def close(self, timeout_s: float = 60.0) -> None:
        """Stop the producer; batches produced but never consumed are recorded as dropped."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        while True:
            try:
                batch = self._queue.get_nowait()
            except queue.Empty:
                break
            if batch is not None:
                self.ledger.drop(batch.ids)
        self.ledger.check_balanced()

    def __enter__(self) -> "AsyncRolloutProducer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
