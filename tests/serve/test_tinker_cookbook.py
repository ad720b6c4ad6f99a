"""Unmodified tinker-cookbook 0.6.1 recipes against the server, offline: `python -m
tinker_cookbook.recipes.math_rl.train env=arithmetic` (RL, importance_sampling) and
`python -m tinker_cookbook.recipes.chat_sl.train` on the cookbook's example_data/conversations.jsonl
(SFT), 2 steps each, on the tiny model directory with the renderer named explicitly (role_colon:
the tiny model has no model card the cookbook knows). What makes them offline: base_url pointing at
the server, model_name a local directory (AutoTokenizer reads its tokenizer files),
HF_HUB_OFFLINE=1, TINKER_TELEMETRY=0; the arithmetic environment and the example conversations
need no download. The cookbook tries once to fetch a price list (5 s timeout); without a network it
only logs a warning, and nothing depends on it.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest


def _run_recipe(module: str, tinker_server, model_dir: str, log_path: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", module, f"model_name={model_dir}", "renderer_name=role_colon",
           f"base_url={tinker_server.url}", f"log_path={log_path}", "behavior_if_log_dir_exists=delete",
           "max_steps=2", "lora_rank=4", "eval_every=0", "save_every=0", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{module} exited {done.returncode}:\n{done.stderr[-4000:]}"


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _finite(record: dict) -> bool:
    return all(math.isfinite(v) for v in record.values() if isinstance(v, (int, float)))


def _final_checkpoint(log_path: Path, tinker_server) -> dict:
    final = _records(log_path / "checkpoints.jsonl")[-1]
    assert final["name"] == "final"
    for key in ("state_path", "sampler_path"):  # the server wrote both, where their names say
        model_id, kind, name = final[key].removeprefix("tinker://").split("/")
        assert (tinker_server.service.state_dir / model_id / kind / name / "meta.json").is_file()
    return final


def test_math_rl_arithmetic_runs_two_steps(tinker_server, tiny_model_dir, tmp_path):
    log_path = tmp_path / "math_rl"
    _run_recipe("tinker_cookbook.recipes.math_rl.train", tinker_server, tiny_model_dir, log_path, "env=arithmetic",
                "groups_per_batch=2", "group_size=2", "loss_fn=importance_sampling")
    metrics = _records(log_path / "metrics.jsonl")
    steps = [m for m in metrics if "env/all/reward/total" in m]
    assert [m["step"] for m in steps] == [0, 1] and all(_finite(m) for m in metrics)
    # the arithmetic reward is 0.1 (format_ok - 1) + correct: in [-0.1, 1]
    assert all(-0.1 - 1e-6 <= m["env/all/reward/total"] <= 1.0 for m in steps)
    final = _final_checkpoint(log_path, tinker_server)
    model_id = final["state_path"].removeprefix("tinker://").split("/")[0]
    assert tinker_server.service.models[model_id].steps == 2  # two optim_steps reached the server


def test_chat_sl_example_conversations_runs_two_steps(tinker_server, tiny_model_dir, tmp_path):
    import tinker_cookbook

    data = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
    log_path = tmp_path / "chat_sl"
    _run_recipe("tinker_cookbook.recipes.chat_sl.train", tinker_server, tiny_model_dir, log_path, f"dataset={data}",
                "batch_size=4", "max_length=128")
    metrics = [m for m in _records(log_path / "metrics.jsonl") if "train_mean_nll" in m]
    assert [m["step"] for m in metrics] == [0, 1] and all(_finite(m) for m in metrics)
    # a random-init decoder predicts close to uniformly: its mean NLL is near ln(vocab size)
    assert metrics[0]["train_mean_nll"] == pytest.approx(math.log(49152), abs=0.3)
    _final_checkpoint(log_path, tinker_server)
