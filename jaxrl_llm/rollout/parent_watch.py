"""Run a command; end its whole process group once the process that launched it is gone.

    python -I parent_watch.py LAUNCHER_PID COMMAND [ARGS...]

`VLLMServer` starts every server through this, in a new session whose process group this
process leads (the server and vLLM's engine-core children join it). Every POLL_S it checks
that its parent is still LAUNCHER_PID; once not (the launcher exited or was killed, even by
SIGKILL or the OOM killer, and this process was re-parented), it sends SIGTERM to the group
and SIGKILL GRACE_S later. It follows the launching *process*: Linux's parent-death signal
(prctl PR_SET_PDEATHSIG) follows the launching *thread*: a server started from a thread that
ended before the process was killed with that thread.

SIGTERM to the group (`VLLMServer.stop`) lets the command shut down: this process waits for it,
then exits as it did (same code, or the same signal). Standard library only: run with `-I` by
file path, outside the package.
"""
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
GRACE_S = 10.0


def end_group(child: subprocess.Popen) -> None:
    """SIGTERM the group (this process ignores it); once the command is gone, or GRACE_S
    later, SIGKILL what is left of it, this process included."""
    os.killpg(0, signal.SIGTERM)
    try:
        child.wait(GRACE_S)
    except subprocess.TimeoutExpired:
        pass
    os.killpg(0, signal.SIGKILL)


def main(argv: list[str]) -> None:
    launcher, command = int(argv[0]), argv[1:]
    signal.signal(signal.SIGTERM, lambda *_: None)  # the group's SIGTERM is for the command
    if os.getppid() != launcher:  # the launcher died before this process got here
        sys.exit(1)
    child = subprocess.Popen(command)
    while child.poll() is None:
        if os.getppid() != launcher:
            end_group(child)
        time.sleep(POLL_S)
    if child.returncode < 0:  # killed by a signal: die by the same one
        signal.signal(-child.returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -child.returncode)
    sys.exit(child.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
