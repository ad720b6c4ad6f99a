"""A launched server must not outlive the process that launched it, even when that
process is SIGKILLed (OOM killer, kill -9): the launcher's pre-exec hook asks Linux
for a parent-death signal. Checked with a stand-in child (`sleep`), no vLLM needed."""
import os
import signal
import subprocess
import sys
import time

LAUNCHER = """
import subprocess, sys
from jaxrl_llm.rollout.vllm_server import _terminate_with_parent
child = subprocess.Popen(["sleep", "300"], start_new_session=True, preexec_fn=_terminate_with_parent)
print(child.pid, flush=True)
import time; time.sleep(300)
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie awaiting its reaper counts as gone
        return f.read().split()[2] != "Z"


def test_child_dies_when_its_launcher_is_killed():
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    child = int(launcher.stdout.readline())
    assert alive(child)
    launcher.send_signal(signal.SIGKILL)
    launcher.wait(timeout=10)
    deadline = time.time() + 10
    while alive(child) and time.time() < deadline:
        time.sleep(0.05)
    assert not alive(child)
