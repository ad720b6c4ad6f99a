"""`python -m jaxrl_llm.benchmarks.cpu.async_vs_sync`: one short tiny-model run per max_lag.

(The staleness values themselves are the loop's business: tests/train/test_async_rollout.py.)"""
import json

import pytest

from jaxrl_llm.benchmarks.cpu import async_vs_sync
from tests.train.tiny_run import REPO, TINY_OVERRIDES


def test_async_vs_sync_benchmark_parses_its_command_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        async_vs_sync.main(["--help"])
    assert exit_info.value.code == 0
    assert "--max-lag" in capsys.readouterr().out


@pytest.mark.slow  # ~1 min on 2 cores: two 2-step training runs of a tiny model
def test_async_vs_sync_benchmark_reports_one_row_per_lag(tiny_model_dir, capsys):
    argv = ["--config", str(REPO / "experiments/demo.py"), "--max-lag", "0", "1", "--", *TINY_OVERRIDES,
            f"model.source={tiny_model_dir}", "total_steps=2"]
    assert async_vs_sync.main(argv) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [row["max_lag"] for row in rows] == [0, 1]
    for row in rows:
        assert row["steps"] == 2 and len(row["staleness"]) == 2
        assert row["ledger"] == {"produced": 2 * 8, "consumed": 2 * 8, "dropped": 0}
        assert row["wall_s"] > 0 and row["steady_s"] > 0 and row["learn_s"] > 0 and row["rollout_s"] > 0
        assert row["wait_s"] >= 0
