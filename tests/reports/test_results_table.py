"""Stored experiment results (experiments/results/*.json, reports/results.py) and the READMEs'
results tables written from them (`make results-table`, reports/results_table.py)."""
import dataclasses
import json
import math

import pytest

from jaxrl_llm.reports import results_table
from jaxrl_llm.reports.results import (RESULTS_DIR, ExperimentResult, experiment_module, read_results, write_result)

FIELDS = ("name", "title", "claim", "setting", "command", "seeds", "tuning_seeds", "statistic", "interval_method",
          "verdict_rule", "exclusion_rule", "verdict", "numbers", "per_seed", "commit", "machine", "wall_s", "source")


def test_both_readmes_are_byte_identical_to_the_generated_tables():
    """Issue 36 acceptance: `make results-table` regenerates both READMEs' tables from the files."""
    rendered = results_table.rendered()
    assert len(rendered) == 2
    for path, text in rendered.items():
        assert path.read_text() == text, f"{path} differs from `make results-table`; run it"


def test_one_results_file_per_experiment_with_the_verdict_its_rule_gives():
    stored = {r["name"]: r for r in read_results()}
    assert set(stored) == set(results_table.SECTIONS)  # the nine experiments of experiments/README.md
    for name, result in stored.items():
        assert set(FIELDS) <= set(result), name
        assert not set(result["seeds"]) & set(result["tuning_seeds"]), name
        module = experiment_module(name)
        assert result["verdict_rule"] == module.VERDICT_RULE and result["claim"] == module.CLAIM, name
        # the verdict is computed by the experiment file's rule from the stored numbers, never typed
        assert module.rule_verdict(result["numbers"]) == result["verdict"], name


def hand_result(**changes):
    fields = dict(name="diversity", title="T", claim="C", setting="S", command="python x.py", seeds=(3, 4, 5),
                  statistic="d", interval_method="t", verdict_rule="R", verdict="inconclusive", headline="a - b x",
                  numbers={"a - b x": {"mean": 0.25, "low": -0.5, "high": 1.0, "n": 3}}, tuning_seeds=(0,),
                  excluded={"6": "grpo diverged"}, wall_s=3723.0, source="run")
    fields.update(changes)
    return ExperimentResult(**fields)


def test_table_row_and_markers_from_a_hand_made_result(tmp_path):
    path = write_result(hand_result(), tmp_path / "diversity.json",
                        provenance={"commit": "abcdef0123", "machine": {"cpu": "CPU-X"}, "date": "d"})
    stored = json.loads(path.read_text())
    assert stored["seeds"] == [3, 4, 5] and stored["tuning_seeds"] == [0] and stored["commit"] == "abcdef0123"
    text = results_table.table([stored], "experiments/README.md")
    row = text.splitlines()[2].split(" | ")
    assert row[0] == "| 8" and row[1].endswith("(experiments/README.md#8-diversity-grpo-vs-darling-on-a-task-with-"
                                               "many-correct-answers)")
    assert row[3] == "**inconclusive** (n = 3; 1 excluded by the fixed rule; tuning seed(s) 0 not counted)"
    assert row[4] == "a - b x: +0.25 [-0.5, +1] (n = 3)"
    assert row[5] == "1 h 2 min; CPU-X" and row[6] == "run, commit abcdef0 |"
    readme = f"before\n{results_table.START}\nold\n{results_table.END}\nafter\n"
    assert results_table.replace_between_markers(readme, "NEW", "R") == \
        f"before\n{results_table.START}\nNEW\n{results_table.END}\nafter\n"
    with pytest.raises(ValueError, match="needs exactly one"):
        results_table.replace_between_markers("no markers", "NEW", "README.md")


def test_caveats_stand_beside_the_verdict_in_the_table(tmp_path):
    """A caveat (e.g. reward hacking of a judge whose score the verdict says rose) is shown in the verdict cell."""
    result = hand_result(verdict="reproduced", tuning_seeds=(), excluded={},
                         caveats=("hacking: seen (exact: -0.09)", "second"))
    stored = json.loads(write_result(result, tmp_path / "diversity.json").read_text())
    row = results_table.table([stored], "").splitlines()[2].split(" | ")
    assert row[3] == "**reproduced** (n = 3); hacking: seen (exact: -0.09); second"


def test_seed_ranges_shorten_three_or_more_consecutive_seeds():
    assert results_table.seed_ranges([2072, 0, 2070, 2071, 2050, 2051, 7]) == "0, 7, 2050, 2051, 2070-2072"
    assert results_table.seed_ranges(list(range(2000, 2034)) + [0]) == "0, 2000-2033"
    assert results_table.seed_ranges([5]) == "5" and results_table.seed_ranges([]) == ""


def test_result_refuses_a_tuning_seed_that_counts_and_an_unknown_verdict():
    with pytest.raises(ValueError, match=r"seeds \[0\] are tuning seeds"):
        hand_result(seeds=(0, 1, 2))
    with pytest.raises(ValueError, match="verdict 'reproduced at this scale'.*valid: one of"):
        hand_result(verdict="reproduced at this scale")
    with pytest.raises(ValueError, match="headline 'missing'"):
        hand_result(headline="missing")
    assert math.isnan(hand_result(numbers={"a - b x": {"mean": 1.0, "low": math.nan, "high": math.nan, "n": 1}})
                      .numbers["a - b x"]["low"])


def test_results_dir_is_the_committed_folder():
    assert RESULTS_DIR.name == "results" and RESULTS_DIR.parent.name == "experiments"


def test_findings_give_one_line_per_claim_from_the_results():
    """experiments/README.md's findings: one line per results file, in experiment order, each naming the
    claim, the verdict with its seeds, the headline statistic and the source."""
    data = {**dataclasses.asdict(hand_result()), "seeds": [3, 4, 5], "tuning_seeds": [0], "commit": "abcdef0123"}
    recorded = {**data, "name": "length_bias", "source": "recorded from the README at f035540; re-run pending"}
    lines = results_table.findings([data, recorded]).splitlines()
    assert lines == [
        "- **1. T.** Claim: C. Found: **inconclusive** (n = 3; 1 excluded by the fixed rule; tuning seed(s) 0 not "
        "counted); a - b x: +0.25 [-0.5, +1] (n = 3) (recorded from the README at f035540; re-run pending).",
        "- **8. T.** Claim: C. Found: **inconclusive** (n = 3; 1 excluded by the fixed rule; tuning seed(s) 0 not "
        "counted); a - b x: +0.25 [-0.5, +1] (n = 3) (run, commit abcdef0)."]
    readme = results_table.rendered()[results_table.REPO / "experiments" / "README.md"]
    block = readme.split(results_table.FINDINGS_START + "\n", 1)[1].split("\n" + results_table.FINDINGS_END, 1)[0]
    assert len(block.splitlines()) == len(read_results()) == len(results_table.SECTIONS)
