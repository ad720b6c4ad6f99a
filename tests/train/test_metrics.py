"""MetricsWriter (JSONL + TensorBoard), resume truncation, and the run_info.json it writes."""

import json
import struct
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from jaxrl_llm.train.config import Config, replace_values
from jaxrl_llm.train.run.metrics import MetricsWriter, read_metrics, truncate_metrics
from jaxrl_llm.train.run.provenance import read_run_info


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _read_events(run_dir: Path) -> list[event_pb2.Event]:
    """Parses TFRecord framing by hand: u64 length, u32 crc, payload, u32 crc."""
    events = []
    for file in sorted((run_dir / "tb").glob("events.out.tfevents.*")):
        data = file.read_bytes()
        pos = 0
        while pos < len(data):
            (length,) = struct.unpack("<Q", data[pos : pos + 8])
            payload = data[pos + 12 : pos + 12 + length]
            pos += 12 + length + 4
            event = event_pb2.Event()
            event.ParseFromString(payload)
            events.append(event)
    return events


def _scalars(events, tag):
    return [(e.step, v.simple_value) for e in events for v in e.summary.value if v.tag == tag]


def test_each_step_is_one_flushed_json_line(tmp_path):
    writer = MetricsWriter(tmp_path, tensorboard=False)
    for step in (1, 2, 3):
        writer.write(step, {"reward/mean": 0.25 * step, "ok": True, "n": np.int32(step), "x": jnp.float32(0.5)})
        # Readable before close: the line was flushed.
        assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == list(range(1, step + 1))
    writer.close()
    records = read_metrics(tmp_path)
    assert [r["reward/mean"] for r in records] == [0.25, 0.5, 0.75]
    assert records[2]["n"] == 3 and type(records[2]["n"]) is int and records[2]["ok"] is True
    assert records[0]["x"] == 0.5
    assert list(records[0])[:2] == ["step", "time"]


def test_bad_steps_and_values_are_errors(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as writer:
        writer.write(5, {"a": 1.0})
        with pytest.raises(ValueError, match=r"step 5 is not after the last logged step 5"):
            writer.write(5, {"a": 2.0})
        with pytest.raises(ValueError, match=r"metric 'hist' .*shape \(3,\); valid: a number"):
            writer.write(6, {"hist": np.zeros(3)})
        with pytest.raises(ValueError, match=r"reserved"):
            writer.write(6, {"step": 1})
    # A second fresh writer must not mix a new run into this file.
    with pytest.raises(FileExistsError, match=r"pass resume_step"):
        MetricsWriter(tmp_path, tensorboard=False)


def test_resume_truncates_lines_after_the_restored_step(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=True) as writer:
        for step in range(1, 6):
            writer.write(step, {"reward/mean": float(step)})
    # The crashed process also left half a line behind.
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "reward/me')

    # Resume from the checkpoint at step 3: steps 4..6 are redone.
    with MetricsWriter(tmp_path, tensorboard=True, resume_step=3) as writer:
        assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2, 3]
        with pytest.raises(ValueError, match=r"step 3 is not after"):
            writer.write(3, {"reward/mean": 0.0})
        for step in range(4, 7):
            writer.write(step, {"reward/mean": 10.0 * step})
    records = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["reward/mean"]) for r in records] == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 40.0), (5, 50.0), (6, 60.0)
    ]

    events = _read_events(tmp_path)
    assert _scalars(events, "reward/mean") == [
        (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0), (5, 5.0), (4, 40.0), (5, 50.0), (6, 60.0)
    ]
    # The second session tells TensorBoard to drop the first session's steps >= 4.
    purges = [e.step for e in events if e.HasField("session_log") and e.session_log.status == e.session_log.START]
    assert purges == [4]


def test_truncate_metrics_counts_dropped_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"step": s, "v": s}) + "\n" for s in range(10)) + "garbage\n")
    assert truncate_metrics(path, 6) == 4  # steps 7, 8, 9 and the broken line
    assert [r["step"] for r in _lines(path)] == list(range(7))
    assert truncate_metrics(path, 6) == 0
    assert truncate_metrics(tmp_path / "absent.jsonl", 3) == 0


def test_writer_with_config_writes_run_info(tmp_path):
    cfg = replace_values(Config(), {"name": "w"})
    with MetricsWriter(tmp_path, tensorboard=False, config=cfg) as writer:
        writer.write(1, {"a": 1})
    assert read_run_info(tmp_path)["config"] == cfg.to_dict()
    disabled = MetricsWriter(tmp_path / "other", enabled=False)
    disabled.write(1, {"a": 1})
    assert not (tmp_path / "other").exists()
