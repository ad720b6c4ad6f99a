"""Weights & Biases tracking (train/run/tracking.py), offline: what the loop logs is read back
from the run's .wandb files with wandb's own reader (`wandb leet inspect --json`)."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from jaxrl_llm import cli
from jaxrl_llm.train.run import loop
from jaxrl_llm.train.run import tracking
from jaxrl_llm.train.config import Config, replace_values
from jaxrl_llm.train.run.metrics import MetricsWriter, read_metrics
from jaxrl_llm.train.run.tracking import ID_FILE
from tests.train.tiny_run import REPO, run_cli, tiny_config


@pytest.fixture(autouse=True)
def wandb_env(tmp_path, monkeypatch):
    """No account, no stored settings, nothing written outside tmp_path; a server address
    where nothing listens, so an attempt to reach one could not succeed."""
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DIR", "WANDB_DATA_DIR", "WANDB_PROJECT", "WANDB_ENTITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb_cache"))
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")
    yield
    assert not wandb_core_children(), "wandb's service process outlived the run"


def wandb_core_children() -> list[str]:
    out = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "cmd="], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if "wandb-core" in line]


def sessions(run_dir) -> list[list[dict]]:
    """The records of each offline session of the run (one .wandb file each), in start order."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    out = []
    for path in files:
        text = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                              capture_output=True, text=True, check=True, timeout=120).stdout
        out.append([json.loads(line) for line in text.splitlines()])
    return sorted(out, key=lambda records: run_record(records)["start_time"])


def run_record(records: list[dict]) -> dict:
    return next(r["run"] for r in records if r["type"] == "run")


def history(logged: list[list[dict]]) -> dict[int, dict]:
    """step -> logged row, as `wandb sync` leaves the run: each session's rewind point
    (resume_from) drops the rows after it; a step logged twice otherwise fails the test."""
    rows: dict[int, dict] = {}
    for records in logged:
        branch = run_record(records).get("branch_point")
        if branch is not None:
            rows = {step: row for step, row in rows.items() if step <= branch.get("value", 0)}
        for record in records:
            if record["type"] == "history":
                step = int(record["history"]["step"]["num"])
                assert step not in rows, f"step {step} logged twice"
                rows[step] = record["history"]["item"]
    return rows


def same(jsonl_value, wandb_value) -> bool:
    if isinstance(jsonl_value, float) and isinstance(wandb_value, str):  # NaN, Infinity
        wandb_value = float(wandb_value)
    if isinstance(jsonl_value, float) and math.isnan(jsonl_value):
        return isinstance(wandb_value, float) and math.isnan(wandb_value)
    return jsonl_value == wandb_value


def assert_history_is_jsonl(run_dir, logged: list[list[dict]]) -> dict[int, dict]:
    rows = history(logged)
    records = read_metrics(run_dir)
    assert sorted(rows) == [r["step"] for r in records]
    for record in records:
        for key, value in record.items():
            if key not in ("step", "time"):
                assert key in rows[record["step"]], (record["step"], key)
                assert same(value, rows[record["step"]][key]), (record["step"], key, value, rows[record["step"]][key])
    return rows


def test_offline_run_logs_every_jsonl_metric_at_every_step_and_resume_rewinds_to_the_checkpoint(tiny_model_dir,
                                                                                                tmp_path):
    """2 steps of the real loop: every metric of metrics.jsonl at every step, the config, git
    commit and versions, the eval curve. Then the state a kill -9 leaves (step 2 logged, its
    checkpoint never written) and --resume to step 3: one W&B run, each step once, equal to
    metrics.jsonl (the resumed session rewinds the run and logs step 1 again from the JSONL)."""
    extra = ("task.eval_every=2", "metrics.wandb=offline", "metrics.wandb_tags=rl,test", "metrics.wandb_group=g")
    cfg = tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=2", *extra)
    loop.train(cfg)
    logged = sessions(cfg.run_path)
    rows = assert_history_is_jsonl(cfg.run_path, logged)
    assert sorted(rows) == [1, 2]
    assert rows[2]["eval/pass_at_k._type"] == "table-file" and rows[2]["eval/pass_at_k.nrows"] == 2
    run = run_record(logged[0])
    assert run["run_id"] == (cfg.run_path / ID_FILE).read_text().strip()
    assert run["project"] == "jaxrl_llm" and run["tags"] == ["rl", "test"] and run["run_group"] == "g"
    config = run["config"]["update"]
    info = json.loads((cfg.run_path / "run_info.json").read_text())
    assert config["git_commit"] == info["git_commit"] and config["versions"] == info["versions"]
    assert config["recipe"]["name"] == cfg.recipe.name and config["total_steps"] == 2
    staged = [p for p in (cfg.run_path / "wandb" / "data").rglob("*") if p.is_file()]
    assert staged, "the eval table is staged in the run directory"

    shutil.rmtree(cfg.run_path / "checkpoints" / "2")
    time.sleep(1.1)  # W&B names a session's folder by the second
    loop.train(tiny_config(tiny_model_dir, tmp_path / "run", "total_steps=3", *extra), resume=True)
    logged = sessions(cfg.run_path)
    first, second = logged
    assert run_record(first)["run_id"] == run_record(second)["run_id"]
    assert run_record(second)["branch_point"].get("value", 0) == 0  # rewound, then steps 1..1 again from the JSONL
    assert sorted(assert_history_is_jsonl(cfg.run_path, logged)) == [1, 2, 3]


@pytest.mark.slow  # two CLI processes (~1 min); the rewind itself is tested in process above
def test_kill_9_then_resume_logs_each_step_once(tiny_model_dir, tmp_path):
    run_dir = tmp_path / "run"
    common = ["--config", str(REPO / "experiments/demo.py"), f"model.source={tiny_model_dir}", f"run_dir={run_dir}",
              "rollout.engine=jax", "total_steps=4", "rollout.prompts_per_step=2", "rollout.samples_per_prompt=4",
              "rollout.max_tokens=6", "train.micro_batch_size=4", "checkpoint.every_steps=2",
              "checkpoint.async_save=false", "metrics.tensorboard=false", "metrics.wandb=offline",
              "task.eval_size=4", "task.eval_samples=2", "task.eval_every=2"]
    victim = run_cli("train", *common)
    deadline = time.time() + 600
    while not (run_dir / "metrics.jsonl").exists() or len(read_metrics(run_dir)) < 3:
        assert victim.poll() is None and time.time() < deadline, victim.stdout.read()
        time.sleep(0.1)
    victim.send_signal(signal.SIGKILL)
    assert victim.wait(timeout=60) == -signal.SIGKILL
    time.sleep(1.1)
    resumed = run_cli("train", *common, "--resume")
    assert resumed.wait(timeout=600) == 0, resumed.stdout.read()
    logged = sessions(run_dir)
    assert len(logged) == 2 and run_record(logged[1])["branch_point"].get("value", 0) == 0
    rows = assert_history_is_jsonl(run_dir, logged)
    assert sorted(rows) == [1, 2, 3, 4]
    assert [step for step, row in rows.items() if "eval/pass_at_k._type" in row] == [2, 4]  # 2: from eval.jsonl


def test_a_wandb_failure_is_logged_once_and_training_goes_on(tmp_path, monkeypatch):
    import wandb

    cfg = replace_values(Config(), {"run_dir": str(tmp_path / "run"), "metrics.wandb": "offline"})
    calls = []

    def broken_log(self, *args, **kwargs):
        calls.append(args)
        raise RuntimeError("W&B is down")

    monkeypatch.setattr(wandb.Run, "log", broken_log)
    # The tracking logger's warnings themselves, not a handler's copies: handlers other tests leave on
    # the "jaxrl_llm" or root logger (cli.main's, logging.basicConfig's) would count one record twice.
    warnings = []
    monkeypatch.setattr(tracking.log, "warning", lambda msg, *args: warnings.append(msg % args))
    with MetricsWriter(cfg.run_path, tensorboard=False, config=cfg) as writer:
        for step in (1, 2, 3):
            writer.write(step, {"reward": step / 10})
        writer.log_eval(3, {"pass_at_k": [0.5]})
    assert [r["step"] for r in read_metrics(cfg.run_path)] == [1, 2, 3]
    assert len(calls) == 1  # W&B is off after the first failure
    assert len(warnings) == 1 and "W&B is down" in warnings[0] and "training goes on" in warnings[0]


def test_media_and_tables_go_to_the_step_row(tmp_path):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cfg = replace_values(Config(), {"run_dir": str(tmp_path / "run"), "metrics.wandb": "offline"})
    fig = Figure(figsize=(1, 1))
    FigureCanvasAgg(fig)
    fig.savefig(tmp_path / "training.png")
    (tmp_path / "bias_table.csv").write_text("recipe,length_exponent\ngrpo,-1.0\n")
    with MetricsWriter(cfg.run_path, tensorboard=False, config=cfg) as writer:
        writer.write(1, {"reward": 0.5})
        writer.wandb.log_media(1, images={"training": tmp_path / "training.png", "absent": tmp_path / "no.png"},
                               tables={"bias/table": tmp_path / "bias_table.csv"})
    row = history(sessions(cfg.run_path))[1]
    assert row["reward"] == 0.5 and row["training._type"] == "image-file" and row["bias/table.nrows"] == 1
    assert not any(key.startswith("absent") for key in row)


def test_wandb_asked_for_but_not_installed_is_a_one_line_error_naming_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as if it were not installed

    def no_model(source):
        raise AssertionError("the model was loaded before the wandb check")

    monkeypatch.setattr(loop, "load_policy", no_model)
    monkeypatch.setattr(cli, "_configure_logging", lambda debug: None)  # leave the session's loggers alone
    code = cli.main(["train", "--config", str(REPO / "experiments/demo.py"), "metrics.wandb=offline",
                     f"run_dir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert code == cli.USAGE_ERROR
    assert err.count("\n") == 1 and "pip install -e '.[wandb]'" in err and "metrics.wandb" in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was loaded or written
