"""Per-step metrics: JSONL + TensorBoard (+ W&B), the group log; run_info.json (train/run/provenance.py)
is written when the writer starts.

Layout of a run directory:

    run_dir/metrics.jsonl   one JSON object per logged step:
                            {"step": 3, "time": 1731...., "reward/mean": 0.4, ...}
    run_dir/tb/             TensorBoard event files (tensorboardX)
    run_dir/wandb/          Weights & Biases run files, with metrics.wandb on (train/run/tracking.py)
    run_dir/run_info.json   config, git commit, package versions, host, date
    run_dir/groups.jsonl    per step, every prompt group's rewards [P][G] and
                            completion lengths [P][G] (`GroupLog`): what the
                            difficulty- and length-bias analyses read

Step convention: `step` is the number of optimiser steps completed when the
values were measured, and a checkpoint at step k holds the state after k
steps. Resuming from checkpoint k therefore keeps metric lines with
step <= k and drops later ones, which the resumed run writes again.
Non-finite floats are written as the JSON extensions NaN / Infinity (Python's
json and pandas read them).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Iterator, Mapping

from jaxrl_llm.train.config import Config
from jaxrl_llm.train.run.provenance import write_run_info
from jaxrl_llm.train.run.tracking import WandbRun, wandb_run
from jaxrl_llm.utils.atomic_files import write_text_atomic

METRICS_FILE = "metrics.jsonl"
TB_DIR = "tb"
GROUPS_FILE = "groups.jsonl"
EVAL_FILE = "eval.jsonl"  # held-out evaluations (train/run/evaluation.py)



# ----------------------------------------------------------------------------
# JSONL reading and truncation
# ----------------------------------------------------------------------------


def _parse_lines(text: str) -> Iterator[tuple[str, dict[str, Any] | None]]:
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            record = None  # a line cut short by a crash
        yield line, record if isinstance(record, dict) and "step" in record else None


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (or of run_dir/metrics.jsonl); unreadable lines are skipped."""
    file = Path(path)
    if file.is_dir():
        file = file / METRICS_FILE
    return [record for _, record in _parse_lines(file.read_text()) if record is not None]


def truncate_metrics(path: str | os.PathLike, last_step: int) -> int:
    """Keeps only records with step <= last_step (and drops broken lines); returns lines dropped.

    The file is replaced atomically, so a crash here loses nothing.
    """
    file = Path(path)
    if not file.exists():
        return 0
    kept, dropped = [], 0
    for line, record in _parse_lines(file.read_text()):
        if record is not None and record["step"] <= last_step:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        write_text_atomic(file, "".join(kept))
    return dropped


# ----------------------------------------------------------------------------
# Writer
# ----------------------------------------------------------------------------


def _scalar(key: str, value: Any) -> bool | int | float | str | None:
    """A JSON scalar from Python, numpy or JAX scalars; arrays with more than one value are an error."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    size = getattr(value, "size", None)
    if size == 1 and hasattr(value, "item"):
        return value.item()
    shape = getattr(value, "shape", None)
    raise ValueError(
        f"metric {key!r} has value {value!r:.80} of type {type(value).__name__}"
        f"{'' if shape is None else f' and shape {shape}'}; valid: a number, bool, str or one-element array"
    )


class MetricsWriter:
    """Writes one JSONL line (flushed) and TensorBoard scalars per logged step.

    Args:
      run_dir: the run's directory.
      tensorboard: also write TensorBoard event files under run_dir/tb.
      resume_step: None for a fresh run (then an existing non-empty
        metrics.jsonl is an error, so two runs are never mixed in one file);
        k when resuming from checkpoint k (lines with step > k are removed
        and TensorBoard is told to discard events from step k+1 on).
      config: if given, run_info.json is written (see `write_run_info`).
      enabled: False makes every method a no-op (e.g. on JAX processes other
        than 0 in a multi-host run).
      wandb: a W&B run the caller owns and finishes (e.g. the demo, which adds its
        figures after training). None: with config.metrics.wandb on, the writer
        opens one itself and finishes it on close. Either is started here.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike,
        *,
        tensorboard: bool = True,
        resume_step: int | None = None,
        config: Config | Mapping[str, Any] | None = None,
        enabled: bool = True,
        wandb: WandbRun | None = None,
    ):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.enabled = enabled
        self._last_step: int | None = None
        self._file = None
        self._tb = None
        self.wandb, self._owns_wandb = None, False
        if not enabled:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        records: list[dict[str, Any]] = []  # resumed: the steps kept, which W&B gets again
        if resume_step is None:
            if self.path.exists() and read_metrics(self.path):
                raise FileExistsError(
                    f"{self.path} already holds metrics; pass resume_step=<restored step> to continue "
                    f"that run, or use a new run_dir"
                )
        else:
            truncate_metrics(self.path, resume_step)
            records = read_metrics(self.path) if self.path.exists() else []
            self._last_step = max((r["step"] for r in records), default=None)
        info = write_run_info(self.run_dir, config, resumed_from_step=resume_step) if config is not None else {}
        if wandb is None and isinstance(config, Config):
            wandb, self._owns_wandb = wandb_run(config), True
        if wandb is not None:
            self.wandb = wandb
            eval_path = self.run_dir / EVAL_FILE  # truncated later by PeriodicEval: filtered here
            evals = read_metrics(eval_path) if records and eval_path.exists() else []
            evals = [r for r in evals if r["step"] <= resume_step]
            wandb.start(resume_step=resume_step, run_info=info, history=records, evals=evals)
        self._file = open(self.path, "a")
        if tensorboard:
            from tensorboardX import SummaryWriter

            purge = None if resume_step is None else resume_step + 1
            # tensorboardX names files by the second; a restart within that
            # second would overwrite the earlier file. The nanosecond suffix
            # keeps both, and sorts them in session order as TensorBoard reads.
            self._tb = SummaryWriter(
                logdir=str(self.run_dir / TB_DIR), purge_step=purge, filename_suffix=f".{time.time_ns()}"
            )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Logs `metrics` at `step`; steps must increase strictly."""
        if not self.enabled:
            return
        if self._file is None:
            raise RuntimeError("MetricsWriter is closed")
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"step {step} is not after the last logged step {self._last_step}; steps must increase")
        reserved = {"step", "time"} & set(metrics)
        if reserved:
            raise ValueError(f"metric names {sorted(reserved)} are reserved; rename them")
        values = {k: _scalar(k, v) for k, v in metrics.items()}
        record = {"step": int(step), "time": time.time(), **values}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        if self._tb is not None:
            for key, value in values.items():
                # NaN marks "undefined this step" (e.g. length_incorrect when all answers are right):
                # kept in the JSONL, left out of TensorBoard, which would warn and draw a gap anyway.
                if isinstance(value, (bool, int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, float(value), global_step=int(step), walltime=record["time"])
            self._tb.flush()
        if self.wandb is not None:
            self.wandb.log(step, values)
        self._last_step = int(step)

    def log_eval(self, step: int, result: Mapping[str, Any]) -> None:
        """An evaluation record's pass@k curve to W&B, where it is on (eval.jsonl has the record)."""
        if self.enabled and self.wandb is not None:
            self.wandb.log_eval(step, result)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._owns_wandb and self.wandb is not None:
            self.wandb.finish()
        self.wandb = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class GroupLog:
    """Appends one JSON line per step with the step's groups: rewards[p][g],
    lengths[p][g] (completion tokens) and truncated[p][g] (hit max_tokens).

    Resuming from checkpoint k drops lines with step > k, as `MetricsWriter` does.
    """

    def __init__(self, run_dir: str | os.PathLike, *, resume_step: int | None = None, enabled: bool = True):
        self.path = Path(run_dir) / GROUPS_FILE
        self.enabled = enabled
        if not enabled:
            return
        if resume_step is None:
            if self.path.exists() and self.path.stat().st_size:
                raise FileExistsError(f"{self.path} already holds groups; resume that run or use a new run_dir")
        else:
            truncate_metrics(self.path, resume_step)

    def write(self, step: int, rewards, lengths, truncated) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), "rewards": _nested(rewards, float), "lengths": _nested(lengths, int),
                  "truncated": _nested(truncated, bool)}
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")


def _nested(array, kind) -> list[list]:
    return [[kind(v) for v in row] for row in array]


def read_groups(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The records of run_dir/groups.jsonl (see `GroupLog`); an error names a run without one."""
    path = Path(run_dir) / GROUPS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist; valid: a run directory written by `jaxrl train` "
                                f"(version with per-group logging)")
    return read_metrics(path)
