"""The results tables of README.md and experiments/README.md, written from experiments/results/*.json.

    python -m jaxrl_llm.reports.results_table           # rewrite both tables (make results-table)
    python -m jaxrl_llm.reports.results_table --check   # exit 1 if a README differs from what it would write

Each README holds its table between the two marker comments START and END; everything
outside them is left as it is. Both tables come from the same files through `table`, so the
READMEs cannot disagree about a verdict or a number. experiments/README.md also holds, between
FINDINGS_START and FINDINGS_END, one line per claim saying what the project found (`findings`),
from the same files.
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Sequence

from jaxrl_llm.reports import stats
from jaxrl_llm.reports.results import RESULTS_DIR, read_results

REPO = RESULTS_DIR.parents[1]
START = "<!-- results-table: written by `make results-table` from experiments/results/*.json; do not edit -->"
END = "<!-- /results-table -->"
FINDINGS_START = ("<!-- findings: one line per claim, written by `make results-table` from experiments/results/*.json; "
                  "do not edit -->")
FINDINGS_END = "<!-- /findings -->"


class Section(NamedTuple):
    number: int
    anchor: str  # the experiment's heading in experiments/README.md


SECTIONS = {
    "length_bias": Section(1, "1-length-bias"),
    "precision_mismatch": Section(2, "2-precision-mismatch"),
    "difficulty_bias": Section(3, "3-difficulty-bias"),
    "sanity_check": Section(4, "4-sanity-check"),
    "length_mechanism": Section(5, "5-length-bias-mechanism-on-a-length-neutral-task"),
    "length_neutral": Section(6, "6-length-bias-with-smollm2-on-a-length-neutral-format"),
    "chain_of_thought": Section(7, "7-chain-of-thought-setting"),
    "diversity": Section(8, "8-diversity-grpo-vs-darling-on-a-task-with-many-correct-answers"),
    "distill_addition": Section(9, "9-on-policy-distillation-smollm2-1-digit-addition"),
    "off_policy": Section(10, "10-off-policy-corrections-under-staleness-and-a-bf16-sampler"),
    "gem_learning": Section(11, "11-a-gem-game-learns"),
    "verifiers_learning": Section(12, "12-a-verifiers-environment-learns"),
    "judge_learning": Section(13, "13-a-judges-reward-moves-its-held-out-score"),
    "judge_learning_smollm2": Section(13, "13-a-judges-reward-moves-its-held-out-score"),
    "tinker_learning": Section(14, "14-the-tinker-cookbooks-arithmetic-recipe-through-serve-tinker"),
}
COLUMNS = ("#", "experiment", "claim", "verdict (seeds that count)", "statistic: mean [95% interval] (n)",
           "wall time, machine", "source")


def duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "not recorded"
    minutes, secs = divmod(int(round(seconds)), 60)
    hours, minutes = divmod(minutes, 60)
    return (f"{hours} h {minutes} min" if hours else f"{minutes} min {secs} s" if minutes else f"{secs} s")


def headline_cell(result: Mapping[str, Any]) -> str:
    key = result.get("headline")
    if not key:
        return "-"
    iv = stats.Interval(**result["numbers"][key])
    if iv.n >= 2 and not math.isfinite(iv.low):  # a count or a single figure, no interval
        return f"{key}: {iv.mean:.3g} (n = {iv.n})"
    return f"{key}: {stats.format_interval(iv, signed=' - ' in key)}"


def seed_ranges(seeds: Sequence[int]) -> str:
    """Seeds as text, three or more consecutive ones as a range: 0, 2000-2033, 2050, 2051."""
    ordered = sorted(set(int(s) for s in seeds))
    runs: list[list[int]] = []
    for seed in ordered:
        if runs and seed == runs[-1][-1] + 1:
            runs[-1].append(seed)
        else:
            runs.append([seed])
    parts = [f"{r[0]}-{r[-1]}" if len(r) >= 3 else ", ".join(map(str, r)) for r in runs]
    return ", ".join(parts)


def verdict_cell(result: Mapping[str, Any]) -> str:
    text = f"**{result['verdict']}**"
    if result["verdict"] == "no verdict":
        return text
    text += f" (n = {len(result['seeds'])}"
    if result.get("excluded"):
        text += f"; {len(result['excluded'])} excluded by the fixed rule"
    if result.get("tuning_seeds"):
        text += f"; tuning seed(s) {seed_ranges(result['tuning_seeds'])} not counted"
    return text + ")" + "".join(f"; {caveat}" for caveat in result.get("caveats", ()))


def machine_cell(result: Mapping[str, Any]) -> str:
    machine = result.get("machine") or {}
    where = machine.get("cpu", "") if isinstance(machine, Mapping) else str(machine)
    wall = duration(result.get("wall_s"))
    if result.get("wall_note"):
        wall += f" ({result['wall_note']})"
    return f"{wall}; {where}" if where else wall


def row(result: Mapping[str, Any], link_prefix: str) -> list[str]:
    section = SECTIONS.get(result["name"])
    number = str(section.number) if section else "-"
    title = f"[{result['title']}]({link_prefix}#{section.anchor})" if section else result["title"]
    source = "run, commit " + str(result.get("commit") or "not recorded")[:7] if result.get("source") == "run" \
        else result.get("source", "")
    return [number, title, result["claim"], verdict_cell(result), headline_cell(result), machine_cell(result), source]


def table(results: Sequence[Mapping[str, Any]], link_prefix: str) -> str:
    """The markdown table of `results` in experiment order; `link_prefix` is the path from the
    README to experiments/README.md ("" inside it)."""
    ordered = sorted(results, key=lambda r: (SECTIONS[r["name"]].number if r["name"] in SECTIONS else 99, r["name"]))
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in row(r, link_prefix)) + " |"
              for r in ordered]
    return "\n".join(lines)


def finding(result: Mapping[str, Any]) -> str:
    """One line: the claim of `result` and what the project found (the rule's verdict, the seeds that
    count, the headline statistic, and whether the number comes from a run)."""
    section = SECTIONS.get(result["name"])
    label = f"{section.number}. " if section else ""
    where = f"run, commit {str(result.get('commit') or 'not recorded')[:7]}" if result.get("source") == "run" \
        else result.get("source", "")
    numbers = headline_cell(result)
    stat = f"; {numbers}" if numbers != "-" else ""
    return f"- **{label}{result['title']}.** Claim: {result['claim']}. Found: {verdict_cell(result)}{stat} ({where})."


def findings(results: Sequence[Mapping[str, Any]]) -> str:
    """The findings list of `results` in experiment order."""
    ordered = sorted(results, key=lambda r: (SECTIONS[r["name"]].number if r["name"] in SECTIONS else 99, r["name"]))
    return "\n".join(finding(r).replace("\n", " ") for r in ordered)


def replace_between_markers(text: str, table_text: str, where: str, start: str = START, end: str = END) -> str:
    if text.count(start) != 1 or text.count(end) != 1 or text.index(start) > text.index(end):
        raise ValueError(f"{where} needs exactly one {start!r} line followed by one {end!r} line around its "
                         f"generated block")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table_text}\n{end}{tail}"


READMES = {"README.md": "experiments/README.md", "experiments/README.md": ""}
WITH_FINDINGS = ("experiments/README.md",)


def rendered(repo: Path = REPO, results_dir: Path | None = None) -> dict[Path, str]:
    """{README path: its text with the table written from the results files}."""
    results = read_results(results_dir or repo / "experiments" / "results")
    out = {}
    for name, prefix in READMES.items():
        path = repo / name
        text = replace_between_markers(path.read_text(), table(results, prefix), name)
        if name in WITH_FINDINGS:
            text = replace_between_markers(text, findings(results), name, FINDINGS_START, FINDINGS_END)
        out[path] = text
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 where a README differs")
    args = parser.parse_args(argv)
    stale = []
    for path, text in rendered().items():
        if path.read_text() != text:
            stale.append(path)
            if not args.check:
                path.write_text(text)
    if args.check and stale:
        print(f"results tables out of date in {', '.join(str(p) for p in stale)}; run `make results-table`")
        return 1
    print("results tables " + ("checked" if args.check else f"written ({len(stale)} changed)"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
