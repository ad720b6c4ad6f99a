"""The sandbox's walls: its limits, and the namespaces, mounts and rlimits that hold them.

:class:`SandboxLimits` are a run's limits. :func:`bwrap_popen_kwargs` gives the
``subprocess.Popen`` arguments that start bwrap (:mod:`jaxrl_llm.rewards.sandbox` builds its
command line) behind them:

- the environment: :data:`SANDBOX_ENV` is bwrap's whole environment, so none of the grader's
  variables (API keys, cloud credentials) reach bwrap, its pid 1 inside, or the program;
- between fork and exec, already under the run's uid, the child sets the rlimits (CPU seconds,
  address space, file size, processes, open files, no POSIX message queues, no core dumps),
  then enters a user namespace of its own in which it is root (mapped to the run's uid), with
  new mount, IPC and network namespaces. There it mounts one tmpfs with a size and an inode
  cap (``tmpfs_mb``, ``tmpfs_files``) on the job folder's ``scratch`` folder (bwrap binds its
  ``tmp`` and ``shm`` folders as /tmp and /dev/shm), writes the SysV IPC limits
  (:data:`IPC_SYSCTLS`) of the new IPC namespace, and leaves the network namespace's loopback
  down (no network at all, so no TCP or UDP buffers either). Then it enters a second user
  namespace that maps it back to the run's uid, so bwrap runs unprivileged, installs a
  seccomp filter that refuses raising a socket's buffers (:func:`socket_buffer_filter`;
  no_new_privs), and sets its parent-death signal last (each credential change clears it). The same steps serve a root
  grader and an ordinary user; a kernel that refuses them makes the sandbox unavailable.
- bwrap then remounts the root, /dev and /proc read-only: nothing but the tmpfs is writable,
  and the program cannot rewrite a sysctl (its uid owns the namespaces' sysctls, /proc's
  read-only mount is what stops it).

Memory: :func:`memory_bound_mb` sums the caps of every path by which a run can hold memory
into the one bound the docs state (docs/architecture.md, "Code execution sandbox"): address
space per process times processes, the tmpfs's bytes and inodes, SysV shared memory and
message queues, and the kernel buffers its open files can hold. Sockets are why the seccomp
filter exists: ``net.core.wmem_max``/``rmem_max`` are global sysctls (read-only in a network
namespace) and may be large (4 MiB on the project's machine, where one sandboxed process held
470 MiB in 30 AF_UNIX socket pairs before the filter, 13.3 MiB after). No cgroup: the bound is
a sum of per-path caps, not one accounted total (cgroup v1 does not charge socket buffers).

Job folders (:func:`new_job_dir`) go in the temporary folder, which in a grading worker is
one of the worker's own that its pool removes when it stops or kills the worker.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import resource
import signal
import tempfile
from pathlib import Path
from typing import Any, Mapping

MB = 1 << 20
PAGE = os.sysconf("SC_PAGE_SIZE")

# bwrap's whole environment (Popen's env=): never the grader's, whose variables may hold
# credentials; bwrap's pid 1 inside keeps this block, and --clearenv/--setenv set the program's.
SANDBOX_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}

# SysV IPC limits written into the sandbox's own IPC namespace (the kernel's defaults allow
# about 2^64 bytes of shared memory, 32000 message queues and 10^9 semaphores).
SYSV_SHM_MB = 16
IPC_SYSCTLS = {
    "kernel/shmmax": SYSV_SHM_MB * MB,  # bytes in one shared memory segment
    "kernel/shmall": SYSV_SHM_MB * MB // PAGE,  # pages in all segments together
    "kernel/shmmni": 16,  # segments
    "kernel/msgmni": 16,  # message queues
    "kernel/msgmnb": 16384,  # bytes queued in one message queue
    "kernel/msgmax": 8192,  # bytes in one message
    "kernel/sem": "32 512 32 16",  # semaphores per set, in all sets, per semop call; sets
}
OPEN_FILES = 64  # RLIMIT_NOFILE per process
KERNEL_BYTES_PER_INODE = 1024  # a tmpfs inode and its dentry: ~0.8 KiB measured (issue 61)
SCRATCH = "scratch"  # the job folder's mountpoint for the sandbox's tmpfs (/tmp and /dev/shm)


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    cpu_s:          CPU seconds (RLIMIT_CPU; SIGXCPU then SIGKILL one second later).
    wall_s:         wall-clock seconds before the sandbox is killed.
    memory_mb:      address space per process (RLIMIT_AS).
    file_size_mb:   largest file it may write (RLIMIT_FSIZE).
    max_processes:  processes and threads of its uid (RLIMIT_NPROC), bwrap's own included.
    output_bytes:   stdout+stderr kept; more kills the sandbox.
    tmpfs_mb:       bytes of its one tmpfs, which backs /tmp and /dev/shm.
    tmpfs_files:    files and folders on that tmpfs (its nr_inodes; each costs the kernel ~1 KiB).
    """

    cpu_s: float = 4.0
    wall_s: float = 5.0
    memory_mb: int = 512
    file_size_mb: int = 16
    max_processes: int = 16
    output_bytes: int = 64 * 1024
    tmpfs_mb: int = 64
    tmpfs_files: int = 4096

    def __post_init__(self):
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf):
                raise ValueError(f"sandbox limit {field.name} must be a positive finite number, got {value!r}")
            if field.type == "int" and not isinstance(value, int):
                raise ValueError(f"sandbox limit {field.name} must be an int, got {value!r}")
        if self.max_processes < 4:
            raise ValueError(f"sandbox limit max_processes must be >= 4 (bwrap and the runner need 3), "
                             f"got {self.max_processes}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> "SandboxLimits":
        """Limits from a config mapping; unknown keys are an error naming the valid ones."""
        if values is not None and not isinstance(values, Mapping):
            raise ValueError(f"sandbox limits must be a mapping of limit names to numbers, got {values!r:.80}")
        values = dict(values or {})
        valid = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(values) - set(valid))
        if unknown:
            raise ValueError(f"unknown sandbox limit(s) {unknown}; valid: {', '.join(valid)}")
        return cls(**values)


def job_parent() -> str:
    """Where job folders go: the temp folder (in a grading worker, a folder of its own that the
    pool removes when it stops or kills the worker) when every uid can enter it, else /tmp
    (the sandbox uid must reach the job folder to mount it)."""
    parent = tempfile.gettempdir()
    return parent if _others_can_enter(parent) else "/tmp"


def _others_can_enter(folder: str) -> bool:
    folder = os.path.realpath(folder)
    while True:
        if not os.stat(folder).st_mode & 0o001:
            return False
        if folder == os.path.dirname(folder):
            return True
        folder = os.path.dirname(folder)


def new_job_dir() -> tempfile.TemporaryDirectory:
    """A fresh job folder (0755, under :func:`job_parent`) holding the empty ``scratch``
    mountpoint; removed when the returned object is cleaned up."""
    job = tempfile.TemporaryDirectory(prefix="jaxrl-sandbox-", dir=job_parent())
    os.chmod(job.name, 0o755)  # readable by the sandbox uid whatever the umask
    os.mkdir(os.path.join(job.name, SCRATCH), 0o755)
    return job


def memory_bound_mb(limits: SandboxLimits) -> dict[str, float]:
    """The most memory one run can hold, by path, in MiB, and their ``"total"``.

    Open files: each of ``max_processes x OPEN_FILES`` descriptors can hold at most half a
    pipe of ``fs.pipe-max-size`` or one AF_UNIX or netlink socket's buffers: twice the larger
    of ``net.core.wmem_default`` and ``rmem_default`` under :func:`socket_buffer_filter`
    (a socket may overshoot its buffer by one packet; measured: 60 sockets filled held
    13.3 MiB at 212992), twice the larger of ``wmem_max`` and ``rmem_max`` on an architecture
    the filter does not know. No TCP or UDP: the loopback is down."""
    socket_sysctls = ("wmem_default", "rmem_default") if socket_buffer_filter() else ("wmem_max", "rmem_max")
    per_socket = 2 * max(_read_sysctl(f"net/core/{name}", 212992) for name in socket_sysctls)
    per_file = max(_read_sysctl("fs/pipe-max-size", MB) / 2, per_socket)
    terms = {
        "address space (memory_mb x max_processes)": limits.memory_mb * limits.max_processes,
        "tmpfs bytes (tmpfs_mb)": limits.tmpfs_mb,
        "tmpfs inodes (tmpfs_files x 1 KiB)": limits.tmpfs_files * KERNEL_BYTES_PER_INODE / MB,
        "SysV shared memory": IPC_SYSCTLS["kernel/shmall"] * PAGE / MB,
        "SysV message queues": IPC_SYSCTLS["kernel/msgmni"] * IPC_SYSCTLS["kernel/msgmnb"] / MB,
        "POSIX message queues (RLIMIT_MSGQUEUE 0)": 0,
        "open-file buffers": limits.max_processes * OPEN_FILES * per_file / MB,
    }
    return {**terms, "total": sum(terms.values())}


def _read_sysctl(name: str, default: int) -> int:
    try:
        return int(Path("/proc/sys", name).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return default


_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE, _PR_SET_SECCOMP, _PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
_CLONE_NEWNS, _CLONE_NEWIPC, _CLONE_NEWNET, _CLONE_NEWUSER = 0x00020000, 0x08000000, 0x40000000, 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x4000, 0x40000


@functools.cache
def _libc():
    return ctypes.CDLL(None, use_errno=True)


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


# (AUDIT_ARCH_*, setsockopt's syscall number) of the architectures the filter knows
_SECCOMP_ARCHES = {"x86_64": (0xC000003E, 54), "aarch64": (0xC00000B7, 208)}
_SOL_SOCKET, _SO_SNDBUF, _SO_RCVBUF, _SO_SNDBUFFORCE, _SO_RCVBUFFORCE = 1, 7, 8, 32, 33


def socket_buffer_filter(machine: str | None = None) -> list[tuple[int, int, int, int]] | None:
    """A seccomp program (classic BPF: (code, jt, jf, k) per instruction) that refuses, with
    EPERM, ``setsockopt(SOL_SOCKET, SO_SNDBUF / SO_RCVBUF / ...FORCE)``: a socket keeps the
    kernel's default buffers (``net.core.wmem_default``/``rmem_default``) instead of up to twice
    ``wmem_max``/``rmem_max``. Calls of another ABI (i386, x32) are refused with ENOSYS. None on an
    architecture it does not know (the open-file term of the bound then follows ``wmem_max``)."""
    arch = _SECCOMP_ARCHES.get(machine or os.uname().machine)
    if arch is None:
        return None
    audit_arch, setsockopt = arch
    load, jeq, jge, ret = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    allow, eperm, enosys = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 38
    return [
        (load, 0, 0, 4), (jeq, 1, 0, audit_arch), (ret, 0, 0, enosys),  # 0-2: seccomp_data.arch
        (load, 0, 0, 0), (jge, 0, 1, 0x40000000), (ret, 0, 0, enosys),  # 3-5: .nr, x32's bit set
        (jeq, 0, 7, setsockopt),  # 6: else allow (14)
        (load, 0, 0, 24), (jeq, 0, 5, _SOL_SOCKET),  # 7-8: args[1], the level (low word); else allow
        (load, 0, 0, 32),  # 9: args[2], the option name (low word)
        (jeq, 4, 0, _SO_SNDBUF), (jeq, 3, 0, _SO_RCVBUF), (jeq, 2, 0, _SO_SNDBUFFORCE),  # 10-12: EPERM (15)
        (jeq, 1, 0, _SO_RCVBUFFORCE),  # 13
        (ret, 0, 0, allow), (ret, 0, 0, eperm),  # 14, 15
    ]


def bwrap_popen_kwargs(limits: SandboxLimits, uid: int | None, nproc: int, job_dir: str) -> dict[str, Any]:
    """The ``subprocess.Popen`` arguments that start bwrap behind the walls: the run's uid
    (when the grader is root), :data:`SANDBOX_ENV` as its whole environment, and the child
    setup between fork and exec (see the module doc)."""
    as_user = {"user": uid, "group": uid, "extra_groups": []} if uid is not None else {}
    return {**as_user, "env": dict(SANDBOX_ENV), "preexec_fn": _child_setup(limits, nproc, job_dir)}


def _child_setup(limits: SandboxLimits, nproc: int, job_dir: str):
    libc = _libc()  # looked up before fork: the child only calls it
    grader_pid = os.getpid()
    scratch = os.path.join(job_dir, SCRATCH)
    tmpfs_options = f"size={limits.tmpfs_mb * MB},nr_inodes={limits.tmpfs_files},mode=0755".encode()
    sysctls = [(f"/proc/sys/{name}", str(value)) for name, value in IPC_SYSCTLS.items()]
    program = socket_buffer_filter()
    filters = (_SockFilter * len(program))(*program) if program else None
    fprog = _SockFprog(len(program), filters) if program else None

    def setup() -> None:  # runs in the child between fork and exec, after the uid change
        _set_rlimits(limits, nproc)
        run_uid, run_gid = os.getuid(), os.getgid()
        libc.prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # the uid change left /proc/self/uid_map to root
        _enter_user_namespace(libc, _CLONE_NEWNS | _CLONE_NEWIPC | _CLONE_NEWNET, inside_uid=0, inside_gid=0)
        _checked(libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None), "making mounts private")
        _checked(libc.mount(b"tmpfs", scratch.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, tmpfs_options),
                 f"mounting the sandbox tmpfs on {scratch}")
        for name in ("tmp", "shm"):
            os.mkdir(os.path.join(scratch, name), 0o700)
        for path, value in sysctls:
            with open(path, "w") as handle:
                handle.write(value)
        _enter_user_namespace(libc, 0, inside_uid=run_uid, inside_gid=run_gid)  # bwrap runs unprivileged
        if fprog is not None:  # inherited by bwrap and everything it starts
            _checked(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
            _checked(libc.prctl(_PR_SET_SECCOMP, 2, ctypes.byref(fprog), 0, 0), "seccomp filter")
        # last: each credential change above clears it. bwrap dies with the grading process
        # (a pool kills a worker past its deadline)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != grader_pid:  # the grader died before the signal was set
            raise ProcessLookupError(f"grading process {grader_pid} is gone")
    return setup


def _set_rlimits(limits: SandboxLimits, nproc: int) -> None:
    cpu = math.ceil(limits.cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    memory = limits.memory_mb * MB
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    size = limits.file_size_mb * MB
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))
    resource.setrlimit(resource.RLIMIT_MSGQUEUE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _enter_user_namespace(libc, flags: int, inside_uid: int, inside_gid: int) -> None:
    """unshare a new user namespace (and ``flags``) in which our ids read as the inside ones."""
    outside_uid, outside_gid = os.getuid(), os.getgid()
    _checked(libc.unshare(_CLONE_NEWUSER | flags), "unshare")
    for name, line in (("setgroups", "deny"), ("uid_map", f"{inside_uid} {outside_uid} 1"),
                       ("gid_map", f"{inside_gid} {outside_gid} 1")):
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(line)


def _checked(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")
