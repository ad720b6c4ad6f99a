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
import contextlib
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Sequence, TypeVar

import numpy as np

from jaxrl_llm.reports import stats
from jaxrl_llm.train.config import Config, ConfigError, apply_overrides, config_from_dict, replace_values
from jaxrl_llm.train.run.metrics import METRICS_FILE, GROUPS_FILE, read_metrics
from jaxrl_llm.train.run.provenance import read_run_info, write_run_info


def experiment_parser(description: str, *, name: str, seeds: tuple[Sequence[int], Sequence[int]] | None = None,
                      results: bool = False) -> argparse.ArgumentParser:
    """--quick, --out, --fresh and dotted config overrides, the same for every experiment;
    with `seeds` = (full-size seeds, --quick seeds) also --seeds (read by `chosen_seeds`); with
    `results` also --results (where to write the stored result, reports/results.py)."""
    from jaxrl_llm.reports.results import code_version

    code_version()  # the commit that runs, read before the run (a result written at its end names it)
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
    if results:
        parser.add_argument("--results", default=None, help="also write the stored result (verdict computed by "
                            f"the experiment's rule) here; a deciding run writes experiments/results/{name}.json")
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


def logged_steps(run: Path) -> int:
    """The last step in run/metrics.jsonl (0 without one)."""
    path = run / METRICS_FILE
    return max((int(r.get("step", 0)) for r in read_metrics(path)), default=0) if path.exists() else 0


def train_or_resume(cfg: Config, *, policy=None, trainer: Callable[..., Any] | None = None) -> Path:
    """Trains `cfg` into cfg.run_path. A run that stopped part-way resumes from
    its latest checkpoint; a finished one is kept, also when its checkpoints were deleted to
    free disk (its metrics.jsonl reaches total_steps). A directory holding a run
    of another config is an error (use another --out or --fresh). `trainer`
    (default: train.loop.train) is called as trainer(cfg, resume=..., policy=...)."""
    from jaxrl_llm.train.run.checkpoint import Checkpointer

    if trainer is None:
        from jaxrl_llm.train.run.loop import train as trainer

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
    if latest is None and info is not None and logged_steps(run) >= cfg.total_steps:
        print(f"[experiment] {run}: finished earlier ({cfg.total_steps} steps logged; its checkpoints were "
              f"removed), kept")
        return run
    if latest is None:  # nothing to resume: lines logged before the first checkpoint are redone
        for name in (METRICS_FILE, GROUPS_FILE):
            (run / name).unlink(missing_ok=True)
        shutil.rmtree(run / "tb", ignore_errors=True)
    else:
        print(f"[experiment] {run}: resuming from step {latest}")
    trainer(cfg, resume=latest is not None, policy=policy)
    return run


# ------------------------------------------------------- runs over seeds
RunKey = tuple[str, int]  # (variant, seed)
T = TypeVar("T")
COMPILE_CACHE_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")


class SeededRuns(NamedTuple):
    """One experiment's runs: every variant at every seed, keyed (variant, seed), in the
    order trained (seed by seed, every variant of a seed)."""
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    configs: dict[RunKey, Config]
    runs: dict[RunKey, Path]

    def per_variant(self, read: Callable[[Path], T]) -> dict[str, list[T]]:
        """{variant: [read(run directory) for each seed, in seed order]}: a summary's inputs."""
        return {v: [read(self.runs[(v, s)]) for s in self.seeds] for v in self.variants}


@contextlib.contextmanager
def compile_cache(directory: Path) -> Iterator[None]:
    """JAX's persistent compilation cache in `directory` while inside (programs taking
    >= 0.5 s to compile); the earlier settings are restored on leaving. Runs of the same
    shapes then compile once and load the programs from disk after that."""
    import jax

    before = {k: getattr(jax.config, k) for k in COMPILE_CACHE_SETTINGS}
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)
    try:
        yield
    finally:
        for k, v in before.items():
            jax.config.update(k, v)


def run_seeded_experiment(args: argparse.Namespace, out: Path, variants: Sequence[str],
                          make_config: Callable[[str, int], Config], quick: Sequence[str], *,
                          model_source: str | None = None, clear_caches: bool = False,
                          train: Callable[..., Path] = train_or_resume,
                          load_policy: Callable[[str], Any] | None = None) -> SeededRuns:
    """Trains `make_config(variant, seed)` (+ the --quick overrides when args.quick, + the
    user's overrides) into <out>/<variant>_s<seed> for every variant at every seed of
    `chosen_seeds(args)`, seed by seed (a run cut short still leaves whole seeds to compare).
    Through `train` (default `train_or_resume`): a finished run is kept, a part-trained one
    resumed. All runs share one policy loaded from `model_source` (default: the first
    config's model.source) and a persistent compilation cache in <out>/jax_cache;
    `clear_caches` drops each run's compiled programs after it (one run's in memory)."""
    import jax

    if load_policy is None:
        from jaxrl_llm.train.policy import load_policy
    seeds = chosen_seeds(args)
    configs = {(v, s): variant_config(make_config(v, s), out, f"{v}_s{s}", quick, args.overrides,
                                      quick_on=args.quick) for s in seeds for v in variants}
    policy = load_policy(model_source or next(iter(configs.values())).model.source)
    runs = {}
    with compile_cache(out / "jax_cache"):
        for key, cfg in configs.items():
            runs[key] = train(cfg, policy=policy)
            if clear_caches:
                jax.clear_caches()
    return SeededRuns(tuple(variants), seeds, configs, runs)


# -------------------------------------------------------------- summaries
def finite_mean(values: Sequence[float]) -> float:
    kept = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return float(np.mean(kept)) if kept else float("nan")


def window_mean(records: Sequence[Mapping[str, Any]], key: str, *, first: int | None = None,
                last: int | None = None) -> float:
    """Mean of `key` over the first or last k records, ignoring NaN (undefined steps)."""
    rows = records[:first] if first is not None else records[-last:] if last is not None else records
    return finite_mean([r.get(key, float("nan")) for r in rows])


def interval_row(label: Mapping[str, Any], per_seed: Mapping[int, Mapping[str, float]], keys: Sequence[str], *,
                 signed: Callable[[str], bool] = lambda key: False) -> dict[str, Any]:
    """A summary row: `label`'s cells, then for each of `keys` the mean and 95% interval over
    the seeds of `per_seed` ({seed: {key: value}}) as a table cell (signed when `signed(key)`)
    and as numbers under "<key> interval", and the per-seed values under "per seed"."""
    row = dict(label)
    for key in keys:
        iv = stats.interval([values[key] for values in per_seed.values()])
        row[key] = stats.format_interval(iv, signed=signed(key))
        row[f"{key} interval"] = iv.to_dict()
    row["per seed"] = {s: dict(values) for s, values in per_seed.items()}
    return row


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
    """Writes <out>/summary.md and summary.json (+ run_info.json with config, versions and
    the commit read when the experiment started), prints the table and returns it."""
    table = markdown_table(rows, columns)
    text = f"## {title}\n\n{table}\n" + "".join(f"\n{n}\n" for n in notes)
    (out / "summary.md").write_text(text)
    (out / "summary.json").write_text(json.dumps({"title": title, "rows": list(rows), "notes": list(notes)},
                                                 indent=2, default=float) + "\n")
    from jaxrl_llm.reports.results import code_version

    commit, dirty = code_version()  # the code that ran: read when the experiment started, not now
    write_run_info(out, dict(config) if config is not None else None,
                   extra={"kind": "experiment summary", "git_commit": commit, "git_dirty": dirty})
    print(text)
    return text

