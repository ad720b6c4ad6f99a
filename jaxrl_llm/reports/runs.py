"""What the experiment scripts (experiments/*.py) share: their command line,
training runs that resume or are kept, and summary tables (their configs are in
experiments/base_configs.py).

An experiment trains a few variants of one config (e.g. three recipes from
the same seed) into <out>/<variant>. Rerunning the same command after a crash
resumes each unfinished variant from its latest checkpoint and keeps the
finished ones, so an interrupted experiment loses at most
`checkpoint.every_steps` steps.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from jaxrl_llm.reports import stats
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides, config_from_dict, replace_values
from jaxrl_llm.train.metrics import METRICS_FILE, GROUPS_FILE, read_run_info, write_run_info


def experiment_parser(description: str, *, name: str,
                      seeds: tuple[Sequence[int], Sequence[int]] | None = None) -> argparse.ArgumentParser:
    """--quick, --out, --fresh and dotted config overrides, the same for every experiment;
    with `seeds` = (full-size seeds, --quick seeds) also --seeds (read by `chosen_seeds`)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    if seeds is not None:
        full, quick = (tuple(s) for s in seeds)
        parser.add_argument("--seeds", default=None, help=f"comma-separated seeds (default {full}; --quick {quick})")
        parser.set_defaults(seed_defaults=(full, quick))
    parser.add_argument("--quick", action="store_true",
                        help="the reduced size that finishes in <= 15 min on a 2-core CPU")
    parser.add_argument("--out", default=None,
                        help=f"output directory (default runs/experiments/{name}/<quick|full>)")
    parser.add_argument("--fresh", action="store_true", help="delete earlier results in --out first")
    parser.add_argument("overrides", nargs="*",
                        help="dotted overrides applied to every variant, e.g. total_steps=4 train.lr=1e-5")
    return parser


def chosen_seeds(args: argparse.Namespace) -> tuple[int, ...]:
    """The seeds of this invocation: --seeds, else the full or --quick defaults of `experiment_parser`."""
    full, quick = args.seed_defaults
    return stats.parse_seeds(args.seeds, quick if args.quick else full)


def output_dir(args: argparse.Namespace, name: str) -> Path:
    out = Path(args.out or os.path.join("runs", "experiments", name, "quick" if args.quick else "full"))
    if args.fresh and out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    return out


def variant_config(base: Config, out: Path, variant: str, quick: Sequence[str], overrides: Sequence[str],
                   *, quick_on: bool) -> Config:
    """`base` with the quick-size overrides (if asked), the user's overrides, and
    its run directory <out>/<variant>."""
    cfg = apply_overrides(base, list(quick) if quick_on else [])
    cfg = apply_overrides(cfg, overrides)
    return replace_values(cfg, {"run_dir": str(out / variant)})


def _comparable(config: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != "run_dir"}


def _stored(config: Mapping[str, Any]) -> dict[str, Any] | None:
    """A run's recorded config with the defaults of fields added since (None if it no longer loads)."""
    try:
        return _comparable(config_from_dict(config).to_dict())
    except ConfigError:
        return None


def train_or_resume(cfg: Config, *, policy=None) -> Path:
    """Trains `cfg` into cfg.run_path. A run that stopped part-way resumes from
    its latest checkpoint; a finished one is kept. A directory holding a run
    of another config is an error (use another --out or --fresh)."""
    from jaxrl_llm.train.loop import train
    from jaxrl_llm.train.checkpoint import Checkpointer

    run = cfg.run_path
    info = read_run_info(run) if run.exists() else None
    if info is not None and info.get("config") and _stored(info["config"]) != _comparable(cfg.to_dict()):
        raise ConfigError(f"{run} holds a run with a different config; valid: the same command as before, "
                          f"another --out, or --fresh to start over")
    with Checkpointer(cfg.checkpoint_path, every_steps=0, keep=cfg.checkpoint.keep) as ckpt:
        latest = ckpt.latest_step()
    if latest is not None and latest >= cfg.total_steps:
        print(f"[experiment] {run}: finished earlier ({latest} steps), kept")
        return run
    if latest is None:  # nothing to resume: lines logged before the first checkpoint are redone
        for name in (METRICS_FILE, GROUPS_FILE):
            (run / name).unlink(missing_ok=True)
        shutil.rmtree(run / "tb", ignore_errors=True)
    else:
        print(f"[experiment] {run}: resuming from step {latest}")
    train(cfg, resume=latest is not None, policy=policy)
    return run


# -------------------------------------------------------------- summaries
def finite_mean(values: Sequence[float]) -> float:
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(kept)) if kept else float("nan")


def window_mean(records: Sequence[Mapping[str, Any]], key: str, *, first: int | None = None,
                last: int | None = None) -> float:
    """Mean of `key` over the first or last k records, ignoring NaN (undefined steps)."""
    rows = records[:first] if first is not None else records[-last:] if last is not None else records
    return finite_mean([r.get(key, float("nan")) for r in rows])


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    def cell(value):
        if isinstance(value, float):
            return "nan" if not math.isfinite(value) else f"{value:.3g}" if abs(value) < 1e-2 and value else f"{value:.3f}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def write_summary(out: Path, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *, title: str,
                  notes: Sequence[str] = (), config: Mapping[str, Any] | None = None) -> str:
    """Writes <out>/summary.md and summary.json (+ run_info.json with config, commit and
    versions), prints the table and returns it."""
    table = markdown_table(rows, columns)
    text = f"## {title}\n\n{table}\n" + "".join(f"\n{n}\n" for n in notes)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"title": title, "rows": list(rows), "notes": list(notes)},
                                                 indent=2, default=float) + "\n")
    write_run_info(out, dict(config) if config is not None else None, extra={"kind": "experiment summary"})
    print(text)
    return text

