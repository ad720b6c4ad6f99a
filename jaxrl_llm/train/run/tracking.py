"""Weights & Biases tracking (metrics.wandb = offline | online; the optional extra `.[wandb]`).

`MetricsWriter` forwards every step's metrics to a `WandbRun` under the JSONL's names and
steps, and starts it with the config, git commit and package versions of run_info.json as
the W&B run's config; held-out evaluations add their pass@k curve as a table, and the demo
adds its training figure, bias-report figures and table.

offline: the run is written to <run_dir>/wandb/offline-run-*/ with no network and no account
(system-metrics sampling is off, the console is left alone); `wandb sync <run_dir>/wandb/offline-run-*`
uploads it later. online: the run streams to the server (`wandb login` first).

Resume: the W&B run id is kept in <run_dir>/wandb_id.txt. A run resumed from checkpoint k
continues that W&B run rewound to its start (resume_from="<id>?_step=0", W&B's rewind) and
first logs steps 1..k again from metrics.jsonl (already truncated to k) and eval.jsonl, then
k+1.. as it runs: no step appears twice, and the W&B history equals metrics.jsonl even where
the killed process's W&B data is incomplete (wandb-core keeps up to
x_transaction_log_flush_interval = 15 s of history in memory, which a kill -9 loses; observed
with 0.31: all of it). Offline, the rewind is recorded in the new session's file and applied
when `wandb sync` uploads the sessions in order. Where the server refuses the rewind (a run it
does not hold, rewind unavailable), the run goes on with resume="allow": W&B then ignores steps
up to its last one, so still no step appears twice.

A W&B failure never stops training: it is logged once (logging.warning) and W&B is off for the
rest of the run.
"""
from __future__ import annotations

import csv
import logging
import os
import secrets
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from jaxrl_llm.train.config import Config, ConfigError, MetricsConfig
from jaxrl_llm.utils.atomic_files import write_text_atomic

log = logging.getLogger(__name__)

ID_FILE = "wandb_id.txt"
# Run-info facts that become the W&B run's config, next to the experiment config.
RUN_INFO_KEYS = ("git_commit", "git_dirty", "versions", "command", "hostname")


def require_wandb(metrics: MetricsConfig) -> None:
    """A one-line ConfigError when the metrics section asks for W&B and the package cannot be imported."""
    if metrics.wandb == "off":
        return
    try:
        import wandb  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"metrics.wandb = {metrics.wandb!r} needs the wandb package, which cannot be imported ({err}); "
            f"install the extra with pip install -e '.[wandb]', or set metrics.wandb=off") from None


def wandb_run(cfg: Config) -> "WandbRun | None":
    """A not-yet-started W&B run for `cfg`, None when metrics.wandb is off."""
    return None if cfg.metrics.wandb == "off" else WandbRun(cfg)


class WandbRun:
    """The W&B run of one run directory. `start` opens it (once); every method returns
    normally whatever W&B does."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.run = None
        self.failed = False

    def start(self, *, resume_step: int | None, run_info: Mapping[str, Any],
              history: Sequence[Mapping[str, Any]] = (), evals: Sequence[Mapping[str, Any]] = ()) -> None:
        """Opens the run. Resumed: `history` (metrics.jsonl's records up to resume_step) and
        `evals` (eval.jsonl's) are logged again, after the rewind."""
        if self.run is None and not self.failed:
            self._guard(self._init, resume_step, run_info)
        if self.run is not None and resume_step is not None:
            self._guard(self._staged, self._replay, history, evals)

    def _replay(self, history: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]]) -> None:
        rows = {r["step"]: {k: v for k, v in r.items() if k not in ("step", "time")} for r in history}
        for record in evals:
            if record["step"] in rows and "pass_at_k" in record:
                rows[record["step"]]["eval/pass_at_k"] = self._curve(record)
        for step in sorted(rows):
            self.run.log(rows[step], step=step)

    def log(self, step: int, values: Mapping[str, Any]) -> None:
        if self.run is not None:
            self._guard(self.run.log, dict(values), step=int(step))

    def log_eval(self, step: int, result: Mapping[str, Any], key: str = "eval/pass_at_k") -> None:
        """The pass@k curve (k = 1..n) of an evaluation record as a table at `step`."""
        if self.run is not None:
            self._guard(self._staged, lambda: self.run.log({key: self._curve(result)}, step=step))

    def _curve(self, result: Mapping[str, Any]):
        return self._wandb.Table(columns=["k", "pass@k"], data=[[k, p] for k, p in enumerate(result["pass_at_k"], 1)])

    def log_media(self, step: int, images: Mapping[str, str | os.PathLike] = (),
                  tables: Mapping[str, str | os.PathLike] = ()) -> None:
        """PNG files as images and CSV files as tables at `step`; missing files are left out."""
        if self.run is None:
            return

        def media():
            out = {k: self._wandb.Image(os.fspath(p)) for k, p in dict(images).items() if os.path.exists(p)}
            for key, path in dict(tables).items():
                if os.path.exists(path):
                    with open(path, newline="") as f:
                        header, *rows = list(csv.reader(f))
                    out[key] = self._wandb.Table(columns=header, data=rows)
            self.run.log(out, step=step)

        self._guard(self._staged, media)

    def finish(self) -> None:
        """Ends the run, and wandb's service process (wandb-core) unless another W&B run is active
        in this process: no process outlives the run."""
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish()
                if self._wandb.run is None:
                    self._wandb.teardown()
            except Exception as err:  # the run is over either way
                log.warning("W&B: finishing the run failed (%s: %s)", type(err).__name__, err)

    close = finish

    @property
    def _wandb(self):
        import wandb

        return wandb

    def _staged(self, fn: Callable[..., Any], *args: Any) -> None:
        """Runs fn with W&B's staging folder (tables are copied there for the upload) under the run's
        wandb/ folder, so an offline run's files all lie in its directory; a WANDB_DATA_DIR set by the
        user is kept."""
        if "WANDB_DATA_DIR" in os.environ:
            return fn(*args)
        os.environ["WANDB_DATA_DIR"] = os.path.join(self.cfg.run_path, "wandb", "data")
        try:
            fn(*args)
        finally:
            del os.environ["WANDB_DATA_DIR"]

    def _guard(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except Exception as err:
            self.failed = True
            log.warning("W&B logging failed (%s: %s); training goes on, without W&B for the rest of this run",
                        type(err).__name__, " ".join(str(err).split())[:300])
            self.finish()

    def _init(self, resume_step: int | None, run_info: Mapping[str, Any]) -> None:
        wandb = self._wandb
        m, run_dir = self.cfg.metrics, Path(self.cfg.run_path)
        id_file = run_dir / ID_FILE
        known = id_file.read_text().strip() if resume_step is not None and id_file.exists() else ""
        run_id = known or secrets.token_hex(6)  # W&B ids: lowercase letters and digits
        write_text_atomic(id_file, run_id + "\n")
        config = {**self.cfg.to_dict(), **{k: run_info.get(k) for k in RUN_INFO_KEYS}}
        settings = wandb.Settings(silent=True, console="off", x_disable_stats=m.wandb == "offline")
        kwargs = dict(id=run_id, project=m.wandb_project, entity=m.wandb_entity, group=m.wandb_group,
                      tags=list(m.wandb_tags) or None, name=self.cfg.name, config=config, dir=os.fspath(run_dir),
                      mode=m.wandb, settings=settings)
        if not known:
            self.run = wandb.init(**kwargs)
            return
        try:
            self.run = wandb.init(resume_from=f"{run_id}?_step=0", **kwargs)
        except Exception as err:
            log.warning("W&B refused to rewind run %s (%s); continuing it with resume='allow' (steps it already "
                        "holds keep their first values)", run_id, " ".join(str(err).split()))
            self.run = wandb.init(resume="allow", **kwargs)
