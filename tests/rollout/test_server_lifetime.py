"""A launched server must not outlive the process that launched it, even when that process
is SIGKILLed (OOM killer, kill -9) and the server was started from a thread that has ended
(Linux's parent-death signal follows the launching thread, so it is not used: a watcher
process leads the server's group, jaxrl_llm/rollout/parent_watch.py). Checked through
`VLLMServer.start` with a fake server (`fake_python`: answers /health, nothing else), no vLLM
needed; and the end-of-run check (tests/leftover_servers.py) finds a server left running."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jaxrl_llm.rollout.vllm_server import VLLMServer
from jaxrl_llm.rollout.vllm_server_config import VLLMServerConfig
from tests import leftover_servers

REPO = Path(__file__).resolve().parents[2]
FAKE_SERVER = """
import http.server, os, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
with open("fake.pid", "w") as f:
    f.write(str(os.getpid()))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""
# Starts the fake server from a thread that ends at once, prints the watcher's pid, then waits.
LAUNCHER = """
import sys, threading, time
from jaxrl_llm.rollout.vllm_server import VLLMServer
from jaxrl_llm.rollout.vllm_server_config import VLLMServerConfig
model_dir, python, log_path = sys.argv[1:]
started = []
thread = threading.Thread(target=lambda: started.append(VLLMServer(VLLMServerConfig(
    model_dir=model_dir, python=python, log_path=log_path, startup_timeout_s=60)).start()))
thread.start()
thread.join()
print(started[0].process.pid, flush=True)
time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper counts as gone
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pid: int, within_s: float) -> bool:
    deadline = time.time() + within_s
    while alive(pid) and time.time() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture
def fake(tmp_path):
    """(model_dir, python): a directory that passes the launcher's checks, and an executable
    that runs FAKE_SERVER whatever vLLM arguments it gets."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text("{}")
    (model_dir / "model.safetensors").write_bytes(b"")
    (tmp_path / "fake_server.py").write_text(FAKE_SERVER)
    python = tmp_path / "fake_python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "fake_server.py"}" "$@"\n')
    python.chmod(0o755)
    return str(model_dir), str(python)


def test_server_started_from_an_ended_thread_lives_until_its_process_is_killed(fake, tmp_path):
    log_path = tmp_path / "logs" / "server.log"
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, *fake, str(log_path)], cwd=REPO,
                                env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True)
    watcher = None
    try:
        watcher = int(launcher.stdout.readline())
        server = int((log_path.parent / "fake.pid").read_text())
        time.sleep(1.0)  # the starting thread ended ~1 s ago: the server must still run
        assert alive(watcher) and alive(server)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=10)
        assert wait_gone(server, 5.0), "the fake server outlived the process that started it"
        assert wait_gone(watcher, 15.0)
    finally:
        launcher.kill()
        launcher.wait()
        if watcher is not None and alive(watcher):  # this test failed: leave nothing behind
            os.killpg(watcher, signal.SIGKILL)


def test_stop_ends_the_group_and_the_record_names_a_server_left_running(fake, tmp_path, monkeypatch):
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("JAXRL_VLLM_PID_DIR", str(record))
    model_dir, python = fake
    server = VLLMServer(VLLMServerConfig(model_dir=model_dir, python=python, log_path=tmp_path / "run" / "server.log",
                                         startup_timeout_s=60)).start()
    try:
        (started,) = [json.loads(p.read_text()) for p in record.iterdir()]
        assert started["pid"] == server.process.pid and started["cwd"] == str(tmp_path / "run")
        assert "test_stop_ends_the_group" in started["test"]
        found = leftover_servers.leftovers(record)  # while it runs: the watcher and the fake server
        assert len(found) == 2 and any("fake_server.py" in line for line in found), found
        assert leftover_servers.main([str(record)]) == 1
    finally:
        server.stop()
    assert server.process.returncode == -signal.SIGTERM  # the watcher exits as the server did
    assert leftover_servers.leftovers(record) == []
