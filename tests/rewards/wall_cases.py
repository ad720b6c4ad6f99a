"""The hostile programs of tests/rewards/test_hostile_walls.py, and the grader they go through.

Each program defines ``f`` returning "pwned" only if its attack beat the wall it aims at (a
secret read, more memory held than the cap allows, a write that should fail); contained, it
defines ``f`` returning "no" or dies, and scores 0. A wall taken down on purpose therefore
shows up as a reward of 1.0 on its case.

``code_reward_holding_a_secret`` is ``code_reward`` in a grading worker whose environment holds
:data:`SECRET` (as an API key in a researcher's shell would be inherited by the pool's workers):
the environment-class programs look for it everywhere the sandbox can reach.
"""
from __future__ import annotations

import dataclasses
import os

from jaxrl_llm.rewards import code_reward

SECRET_NAME = "JAXRL_PLANTED_API_KEY"
SECRET = "sk-planted-7f3a9c1e55d04b2e"  # a fixed value: every worker process must plant the same one
PWNED = "\ndef f():\n    return 'pwned' if won else 'no'\n"


def code_reward_holding_a_secret(completion, example):
    os.environ[SECRET_NAME] = SECRET
    return code_reward(completion, example)


code_reward_holding_a_secret.warm_up = code_reward.warm_up


@dataclasses.dataclass(frozen=True)
class Case:
    """A hostile program, the wall it tests, and the statuses its containment may end in."""

    name: str
    wall: str
    program: str
    statuses: tuple[str, ...] = ("ok",)  # "ok": it ran to the end and lost; error/timeout: stopped


def _secret_hunt(body: str) -> str:
    """A program that fills ``loot`` (bytes) by ``body`` and wins if the secret is in it."""
    return (f"import os, ctypes\nloot = b''\ntry:\n{_indent(body)}\nexcept Exception as exc:\n"
            f"    loot += repr(exc).encode()\nwon = {SECRET.encode()!r} in loot\n"
            "print(loot[-300:])" + PWNED)


def _indent(body: str) -> str:
    return "\n".join("    " + line for line in body.strip("\n").splitlines())


_READ_PID1_REGIONS = """
def regions(pid):
    for line in open(f'/proc/{pid}/maps'):
        span, perms = line.split()[:2]
        if perms.startswith('r'):
            start, end = (int(x, 16) for x in span.split('-'))
            yield start, min(end, start + (4 << 20))
"""

ENVIRONMENT_CASES = [
    Case("own environ", "env", _secret_hunt("loot += repr(dict(os.environ)).encode()")),
    Case("/proc/self/environ", "env", _secret_hunt("loot += open('/proc/self/environ', 'rb').read()")),
    Case("/proc/1/environ", "env", _secret_hunt("loot += open('/proc/1/environ', 'rb').read()")),
    Case("every /proc/*/environ and cmdline", "env", _secret_hunt(
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for name in ('environ', 'cmdline'):\n"
        "        try:\n            loot += open(f'/proc/{pid}/{name}', 'rb').read()\n"
        "        except OSError:\n            pass")),
    Case("/proc/1/mem", "env", _secret_hunt(_READ_PID1_REGIONS + (
        "mem = open('/proc/1/mem', 'rb', buffering=0)\n"
        "for start, end in regions(1):\n"
        "    try:\n        mem.seek(start)\n        loot += mem.read(end - start)\n"
        "    except OSError:\n        pass"))),
    Case("process_vm_readv on pid 1", "env", _secret_hunt(_READ_PID1_REGIONS + (
        "class iovec(ctypes.Structure):\n"
        "    _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.POINTER(iovec), ctypes.c_ulong,\n"
        "                                  ctypes.POINTER(iovec), ctypes.c_ulong, ctypes.c_ulong]\n"
        "libc.process_vm_readv.restype = ctypes.c_ssize_t\n"
        "for start, end in regions(1):\n"
        "    buf = ctypes.create_string_buffer(end - start)\n"
        "    local, remote = iovec(ctypes.addressof(buf), end - start), iovec(start, end - start)\n"
        "    n = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)\n"
        "    if n > 0:\n        loot += buf.raw[:n]"))),
    Case("ptrace PEEKDATA of pid 1's environment block", "env", _secret_hunt(
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.ptrace.restype = ctypes.c_long\n"
        "libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]\n"
        "fields = open('/proc/1/stat').read().rpartition(')')[2].split()\n"
        "env_start, env_end = int(fields[47]), int(fields[48])  # fields 50 and 51 of proc(5)\n"
        "if libc.ptrace(16, 1, None, None) != 0:  # PTRACE_ATTACH\n"
        "    raise OSError(ctypes.get_errno(), 'PTRACE_ATTACH')\n"
        "os.waitpid(1, os.WUNTRACED | 0x40000000)  # __WALL\n"
        "for address in range(env_start, min(env_end, env_start + 65536), 8):\n"
        "    word = libc.ptrace(2, 1, ctypes.c_void_p(address), None)  # PTRACE_PEEKDATA\n"
        "    loot += (word & (2**64 - 1)).to_bytes(8, 'little')\n"
        "libc.ptrace(17, 1, None, None)  # PTRACE_DETACH")),
]

MIB = 1 << 20

MEMORY_CASES = [
    # 8 MiB files (under RLIMIT_FSIZE) until 1 GiB or the first refusal; more than 64 MiB wins
    Case("1 GiB into /dev/shm", "tmpfs size", (
        "import os\nwritten = 0\nchunk = b'x' * (1 << 20)\n"
        "try:\n    for i in range(128):\n        with open(f'/dev/shm/fill{i}', 'wb') as out:\n"
        "            for _ in range(8):\n                written += out.write(chunk)\n"
        "except OSError:\n    pass\nwon = written > (64 << 20)" + PWNED)),
    Case("1 GiB into /tmp", "tmpfs size", (
        "import os\nwritten = 0\nchunk = b'x' * (1 << 20)\n"
        "try:\n    for i in range(128):\n        with open(f'/tmp/fill{i}', 'wb') as out:\n"
        "            for _ in range(8):\n                written += out.write(chunk)\n"
        "except OSError:\n    pass\nwon = written > (64 << 20)" + PWNED)),
    Case("1 GiB of SysV shared memory, touched and detached", "IPC limits", (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\nlibc.shmat.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int]\n"
        "libc.shmdt.argtypes = [ctypes.c_void_p]\nheld = 0\n"
        "for size in [1 << 30] + [16 << 20] * 64:\n"
        "    segment = libc.shmget(0, ctypes.c_size_t(size), 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600\n"
        "    if segment < 0:\n        continue\n"
        "    address = libc.shmat(segment, None, 0)\n"
        "    if address in (None, 2**64 - 1):\n        continue\n"
        "    ctypes.memset(address, 1, size)\n    libc.shmdt(ctypes.c_void_p(address))\n    held += size\n"
        "won = held > (16 << 20)" + PWNED)),
    Case("SysV message queues filled", "IPC limits", (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "class msg(ctypes.Structure):\n    _fields_ = [('mtype', ctypes.c_long), ('text', ctypes.c_char * 8192)]\n"
        "held = 0\nmessage = msg(1, b'x' * 8192)\n"
        "for _ in range(64):\n    queue = libc.msgget(0, 0o1600)\n    if queue < 0:\n        break\n"
        "    while libc.msgsnd(queue, ctypes.byref(message), 8192, 0o4000) == 0:  # IPC_NOWAIT\n"
        "        held += 8192\n"
        "won = held > (256 << 10)" + PWNED)),
    Case("POSIX message queue", "RLIMIT_MSGQUEUE", (
        "import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "queue = libc.mq_open(b'/jaxrl', 0o100 | 2, 0o600, None)  # O_CREAT | O_RDWR\n"
        "won = queue >= 0" + PWNED)),
    Case("300k empty files in /tmp", "tmpfs inodes", (
        "import os\ncreated = 0\n"
        "try:\n    for i in range(300_000):\n        os.mknod(f'/tmp/{i}')\n        created += 1\n"
        "except OSError:\n    pass\nwon = created > 10_000" + PWNED)),
    Case("300k empty files in /dev/shm", "tmpfs inodes", (
        "import os\ncreated = 0\n"
        "try:\n    for i in range(300_000):\n        os.mknod(f'/dev/shm/{i}')\n        created += 1\n"
        "except OSError:\n    pass\nwon = created > 10_000" + PWNED)),
    Case("a file in the root", "read-only root", (
        "try:\n    open('/fill', 'wb').write(b'x' * (1 << 20))\n    won = True\n"
        "except OSError:\n    won = False" + PWNED)),
    Case("a file in /dev", "read-only /dev", (
        "try:\n    open('/dev/fill', 'wb').write(b'x' * (1 << 20))\n    won = True\n"
        "except OSError:\n    won = False" + PWNED)),
    Case("raise its own IPC limit through /proc/sys", "read-only /proc", (
        "try:\n    open('/proc/sys/kernel/shmmax', 'w').write(str(1 << 40))\n    won = True\n"
        "except OSError:\n    won = False" + PWNED)),
    Case("socket buffers raised and filled", "seccomp filter", (
        "import socket\nheld, sockets = 0, []\n"
        "try:\n    while True:\n        pair = socket.socketpair()\n        sockets += pair\n"
        "        for end in pair:\n            try:\n"
        "                end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 << 20)\n"
        "            except OSError:\n                pass\n"
        "            end.setblocking(False)\n            try:\n                while True:\n"
        "                    held += end.send(bytes(65536))\n            except BlockingIOError:\n                pass\n"
        "except OSError:  # out of file descriptors\n    pass\nwon = held > (64 << 20)" + PWNED)),
    Case("a TCP connection to itself on the loopback", "network namespace", (
        "import socket\ntry:\n    server = socket.socket()\n    server.bind(('127.0.0.1', 0))\n    server.listen(1)\n"
        "    socket.create_connection(server.getsockname(), timeout=1)\n    won = True\n"
        "except OSError:\n    won = False" + PWNED)),
]

HOLDING_CASES = [
    Case("fork bomb", "RLIMIT_NPROC", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
         statuses=("error", "timeout")),
    Case("thread bomb", "RLIMIT_NPROC", (
        "import threading, time\nstarted = 0\n"
        "try:\n    for _ in range(1000):\n        threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
        "        started += 1\nexcept RuntimeError:\n    pass\nwon = started > 16" + PWNED)),
    Case("memory hog (2 GiB touched)", "RLIMIT_AS", (
        "try:\n    hog = bytearray(2 << 30)\n    won = True\nexcept MemoryError:\n    won = False" + PWNED)),
    Case("zip bomb unpacked into /tmp", "tmpfs size, RLIMIT_FSIZE", (
        "import zlib\nbomb = zlib.compress(bytes(64 << 20), 9)\nwritten = 0\n"
        "try:\n    for i in range(16):\n        with open(f'/tmp/bomb{i}', 'wb') as out:\n"
        "            written += out.write(zlib.decompress(bomb))\nexcept OSError:\n    pass\n"
        "won = written > (64 << 20)" + PWNED)),
    Case("output flood", "output cap", "import sys\nline = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(line)" + "\nwon = True" + PWNED,
         statuses=("error",)),
    Case("infinite loop", "RLIMIT_CPU", "while True:\n    pass", statuses=("error", "timeout")),
    Case("sleep past the deadline, SIGTERM/SIGINT/SIGXCPU ignored", "wall clock", (
        "import signal, time\nfor sig in (signal.SIGTERM, signal.SIGINT, signal.SIGXCPU, signal.SIGHUP):\n"
        "    signal.signal(sig, signal.SIG_IGN)\ntime.sleep(60)\nwon = True" + PWNED), statuses=("timeout",)),
    Case("raise its rlimits", "hard rlimits", (
        "import resource\nwon = False\n"
        "for limit in (resource.RLIMIT_AS, resource.RLIMIT_NPROC, resource.RLIMIT_CPU, resource.RLIMIT_FSIZE,\n"
        "              resource.RLIMIT_NOFILE, resource.RLIMIT_MSGQUEUE):\n"
        "    try:\n        resource.setrlimit(limit, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n        won = True\n"
        "    except (ValueError, OSError):\n        pass" + PWNED)),
    Case("read /etc/passwd and the checkout", "mount namespace", (
        f"won = False\nfor path in ('/etc/passwd', {os.path.abspath(__file__)!r}, '/root/.bashrc', '/proc/1/root/etc/passwd'):\n"
        "    try:\n        open(path).read(1)\n        won = True\n    except OSError:\n        pass" + PWNED)),
    Case("a new user namespace", "--disable-userns", (
        "import ctypes\nwon = ctypes.CDLL(None, use_errno=True).unshare(0x10000000) == 0" + PWNED)),
]


def write_host_file_case(planted: str, escaped: str) -> Case:
    """Delete a planted host file and write a new one beside it (paths known only at test time)."""
    return Case("delete and write host files", "mount namespace", (
        "import os\nwon = False\n"
        f"try:\n    os.remove({planted!r})\n    won = True\nexcept OSError:\n    pass\n"
        f"try:\n    open({escaped!r}, 'w').write('x')\n    won = True\nexcept OSError:\n    pass" + PWNED))


def connect_case(port: int) -> Case:
    return Case("connect to a port the grader's host listens on", "network namespace", (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n    won = True\n"
        "except OSError:\n    won = False" + PWNED))


# A program that uses every wall's room honestly: files in /tmp, a multiprocessing lock (a
# semaphore file in /dev/shm), one small SysV segment, a few threads. It must score 1.
HONEST_NEIGHBOUR = (
    "import ctypes, multiprocessing, threading\n"
    "open('/tmp/scratch.txt', 'w').write('x' * 4096)\nlock = multiprocessing.Lock()\n"
    "with lock:\n    pass\n"
    "segment = ctypes.CDLL(None).shmget(0, ctypes.c_size_t(1 << 20), 0o1600)\n"
    "workers = [threading.Thread(target=sum, args=([1, 2],)) for _ in range(4)]\n"
    "for worker in workers:\n    worker.start()\nfor worker in workers:\n    worker.join()\n"
    "won = segment >= 0 and open('/tmp/scratch.txt').read() == 'x' * 4096" + PWNED)
