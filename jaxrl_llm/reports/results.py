"""An experiment's stored result: experiments/results/<name>.json, one writer for every experiment.

A result names the claim, the setting and command, the seeds that count (and apart from
them the tuning seeds used to choose a setting, which never count, and the seeds an
exclusion rule fixed in the experiment file removed), the statistic and its interval
method, the verdict rule as written in the experiment file before the run, and the verdict
computed from that rule and the stored numbers, never typed by hand. Provenance: commit,
machine, date, wall time. `make results-table` (reports/results_table.py) writes the
READMEs' results tables from these files.
"""
from __future__ import annotations

import dataclasses
import functools
import datetime as _dt
import json
import os
import platform
import socket
from pathlib import Path
from typing import Any, Mapping, Sequence

from jaxrl_llm.reports import stats
from jaxrl_llm.train.run.provenance import git_commit, git_dirty

RESULTS_DIR = Path(__file__).resolve().parents[2] / "experiments" / "results"
VERDICTS = ("reproduced", "not reproduced", "inconclusive", "no verdict")


@dataclasses.dataclass(frozen=True)
class ExperimentResult:
    """One experiment's result. `numbers` maps a statistic's name to its interval
    ({"mean", "low", "high", "n"}); `per_seed` maps it to {seed: value}, the numbers the
    interval is computed from (empty where only the summary was recorded). `headline` names
    the entry of `numbers` the verdict reads first (shown in the tables). `caveats`: what the rule
    reports beside the verdict that a reader of the verdict must not miss (shown next to it in the
    tables), e.g. reward hacking of a judge whose score the verdict says rose."""

    name: str
    title: str
    claim: str
    setting: str
    command: str
    seeds: tuple[int, ...]
    statistic: str
    interval_method: str
    verdict_rule: str
    verdict: str
    headline: str
    numbers: Mapping[str, Mapping[str, float]]
    per_seed: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
    tuning_seeds: tuple[int, ...] = ()
    exclusion_rule: str = "none: every seed counts"
    excluded: Mapping[str, str] = dataclasses.field(default_factory=dict)
    wall_s: float | None = None
    wall_note: str = ""
    source: str = "run"
    notes: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()

    def __post_init__(self):
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict {self.verdict!r} of {self.name} is invalid; valid: one of {VERDICTS}")
        if (self.headline or self.verdict != "no verdict") and self.headline not in self.numbers:
            raise ValueError(f"headline {self.headline!r} of {self.name} is not among its numbers {list(self.numbers)}")
        if set(self.seeds) & set(self.tuning_seeds):
            raise ValueError(f"{self.name}: seeds {sorted(set(self.seeds) & set(self.tuning_seeds))} are tuning "
                             f"seeds and may not count towards the verdict")


def interval_dict(iv: stats.Interval) -> dict[str, float]:
    return iv.to_dict()


def paired(per_seed_a: Mapping[int, float], per_seed_b: Mapping[int, float]) -> dict[int, float]:
    """{seed: a - b} over the seeds both have: a paired difference's inputs."""
    return {s: float(per_seed_a[s]) - float(per_seed_b[s]) for s in per_seed_a if s in per_seed_b}


def machine() -> dict[str, Any]:
    """The machine a result was measured on: host, CPU model, cores, load average now."""
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"hostname": socket.gethostname(), "cpu": model, "cores": os.cpu_count(),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


@functools.lru_cache(maxsize=None)
def code_version() -> tuple[str | None, bool | None]:
    """(commit, dirty) of the checkout, read once per process: `experiment_parser` reads it when an
    experiment starts, so a result names the code that ran, not a HEAD that moved during the run."""
    return git_commit(), git_dirty()


def write_result(result: ExperimentResult, path: str | os.PathLike | None = None, *,
                 provenance: Mapping[str, Any] | None = None) -> Path:
    """Writes `result` to `path` (default experiments/results/<name>.json) with the commit,
    dirty flag, machine and date (or the given `provenance`, for results recorded from an
    earlier run); returns the path."""
    out = Path(path) if path is not None else RESULTS_DIR / f"{result.name}.json"
    data = dataclasses.asdict(result)
    data["seeds"], data["tuning_seeds"] = list(result.seeds), list(result.tuning_seeds)
    data.update(provenance if provenance is not None else {
        "commit": code_version()[0], "dirty": code_version()[1], "machine": machine(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2, sort_keys=False, default=float) + "\n")
    return out


def read_results(directory: str | os.PathLike = RESULTS_DIR) -> list[dict[str, Any]]:
    """Every experiments/results/*.json, in file-name order."""
    return [json.loads(p.read_text()) for p in sorted(Path(directory).glob("*.json"))]


def keyed(per_seed: Mapping[int, float]) -> dict[str, float]:
    """{seed: value} with string keys, as JSON stores them."""
    return {str(s): float(v) for s, v in per_seed.items()}


def interval_of(per_seed: Mapping[int, float] | Sequence[float]) -> stats.Interval:
    values = list(per_seed.values()) if isinstance(per_seed, Mapping) else list(per_seed)
    return stats.interval(values)


def number(numbers: Mapping[str, Mapping[str, float]], key: str) -> stats.Interval:
    """numbers[key] (a stored interval) as a stats.Interval: what a verdict rule reads."""
    return stats.Interval(**{k: float(v) if k != "n" else int(v) for k, v in numbers[key].items()})


def side(iv: stats.Interval) -> str:
    """"above 0", "below 0" or "covers 0" (also with < 2 seeds: no interval)."""
    if iv.n < 2 or not iv.excludes_zero():
        return "covers 0"
    return "above 0" if iv.low > 0 else "below 0"


def experiment_module(name: str):
    """experiments/<name>.py as a module (with experiments/ on sys.path, as when it runs as a
    script): where its CLAIM, VERDICT_RULE and rule_verdict live."""
    import importlib.util
    import sys

    folder = RESULTS_DIR.parent
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(f"experiment_{name}", folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
