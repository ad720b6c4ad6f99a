"""Hostile programs through the grading pool: each is contained, scores 0, the grading call
returns, the pool's workers survive, and the next honest program still scores 1.

Each program would define ``f() == 'pwned'`` (reward 1.0) if its attack worked, so removing
the matching limit from the sandbox turns that test red (see docs/architecture.md,
"Code execution sandbox", for which limit each case depends on).
"""
import socket
import time

import pytest

from jaxrl_llm.rewards import GraderPool, code_reward
from tests.rewards.sandbox_cases import example, fenced, require_sandbox, sandbox_processes_under, worker_temp_dirs

HONEST = fenced("def f():\n    return 'pwned'")  # passes PWNED_TEST: the pool still works


@pytest.fixture(scope="module")
def pool():
    require_sandbox()
    with GraderPool(1, timeout_s=60) as grader_pool:
        yield grader_pool


def grade_hostile(pool, program, **limits):
    """Grade the hostile program then an honest one in one batch; check nothing lingers."""
    pids_before, folders = pool.worker_pids, worker_temp_dirs(pool)
    started = time.monotonic()
    result = pool.grade(code_reward, [fenced(program), HONEST], [example(**limits)] * 2)
    elapsed = time.monotonic() - started
    assert result.rewards == (0.0, 1.0), result
    folders += worker_temp_dirs(pool)  # workers started by this batch (other sessions' sandboxes are not ours)
    assert sandbox_processes_under(folders) == [], "a sandboxed process outlived its grading call"
    if pids_before:
        assert pool.worker_pids == pids_before, f"the grading worker was replaced: {result.errors}"
    return result, elapsed


def test_cannot_read_etc_passwd(pool):
    grade_hostile(pool, "data = open('/etc/passwd').read()\nassert 'root' in data\n"
                        "def f():\n    return 'pwned'")


def test_cannot_read_run_checkpoints_or_checkout(pool, tmp_path):
    checkpoint = tmp_path / "run" / "checkpoints" / "step_1" / "params.bin"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_text("SECRET-WEIGHTS")
    checkout = __file__
    program = ("seen = []\n"
               f"for path in ({str(checkpoint)!r}, {checkout!r}, '/root/.bashrc', '/work'):\n"
               "    try:\n        seen.append(open(path).read(1))\n    except OSError:\n        pass\n"
               "def f():\n    return 'pwned' if seen else 'no'")
    grade_hostile(pool, program)


def test_cannot_write_outside_or_delete(pool, tmp_path):
    planted = tmp_path / "run" / "metrics.jsonl"
    planted.parent.mkdir()
    planted.write_text("keep me")
    escaped = tmp_path / "run" / "escaped.txt"
    program = ("import os\nhits = 0\n"
               f"try:\n    os.remove({str(planted)!r}); hits += 1\nexcept OSError:\n    pass\n"
               f"try:\n    open({str(escaped)!r}, 'w').write('x'); hits += 1\nexcept OSError:\n    pass\n"
               "def f():\n    return 'pwned' if hits else 'no'")
    grade_hostile(pool, program)
    assert planted.read_text() == "keep me" and not escaped.exists()


def test_cannot_connect_to_a_local_port(pool):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        port = listener.getsockname()[1]
        program = (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1).close()\n"
                   "def f():\n    return 'pwned'")
        grade_hostile(pool, program)
        listener.setblocking(False)
        with pytest.raises(BlockingIOError):  # nobody connected
            listener.accept()


def test_process_count_is_capped(pool):
    # 40 sleeping children: more than max_processes=8 allows; a mild, bounded fork bomb
    program = ("import os, time\nfor _ in range(40):\n    if os.fork() == 0:\n        time.sleep(1)\n"
               "        os._exit(0)\ndef f():\n    return 'pwned'")
    result, _ = grade_hostile(pool, program)
    assert result.statuses[0] == "ok"  # fork raised BlockingIOError: the program failed, nothing killed


@pytest.mark.timeout(120)
def test_fork_bomb_is_contained(pool):
    result, elapsed = grade_hostile(pool, "import os\nwhile True:\n    try:\n        os.fork()\n"
                                          "    except OSError:\n        pass")
    assert result.statuses[0] in ("timeout", "error") and elapsed < 30


def test_address_space_is_capped(pool):
    # reserves 10 GB without touching it: harmless even where the limit is missing
    grade_hostile(pool, "import mmap\nm = mmap.mmap(-1, 10 << 30)\ndef f():\n    return 'pwned'")


@pytest.mark.timeout(120)
def test_ten_gigabyte_allocation_fails(pool):
    result, _ = grade_hostile(pool, "b = bytearray(10 << 30)\ndef f():\n    return 'pwned'")
    assert result.statuses[0] == "ok"  # MemoryError: the program failed, nothing had to be killed


@pytest.mark.timeout(120)
def test_infinite_loop_is_stopped_by_the_cpu_limit(pool):
    # wall_s 20 s: only RLIMIT_CPU (1 s) can stop it within 10 s
    result, elapsed = grade_hostile(pool, "while True:\n    pass", cpu_s=1, wall_s=20.0)
    assert result.statuses[0] == "error" and elapsed < 10, (result, elapsed)


def test_sleep_past_the_deadline_is_stopped_by_the_wall_clock(pool):
    result, elapsed = grade_hostile(pool, "import time\ntime.sleep(30)\ndef f():\n    return 'pwned'",
                                    wall_s=2.0)
    assert result.statuses[0] == "timeout" and elapsed < 10, (result, elapsed)


def test_killing_its_parents_harms_no_grader(pool):
    # kill the parent and the grandparent (outside a pid namespace: bwrap, then the grading worker)
    program = ("import os, time\n"
               "def parent_of(pid):\n    return int(open(f'/proc/{pid}/stat').read().rpartition(')')[2].split()[1])\n"
               "me = os.getpid()\nancestors = [parent_of(me)]\n"
               "if ancestors[0] > 1:\n    ancestors.append(parent_of(ancestors[0]))\n"
               "for pid in reversed(ancestors):\n    try:\n        os.kill(pid, 9)\n    except OSError:\n        pass\n"
               "time.sleep(0.5)\ndef f():\n    return 'no'")
    pool.grade(code_reward, [HONEST], [example()])  # workers up, so their pids are compared
    grade_hostile(pool, program)


@pytest.mark.timeout(120)
def test_printing_a_gigabyte_is_cut_off(pool):
    program = ("import sys\nline = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(line)\n"
               "def f():\n    return 'pwned'")
    result, elapsed = grade_hostile(pool, program)
    assert result.statuses[0] == "error" and "printed more than 65536 bytes" in result.errors[0]


def test_sandbox_dies_with_a_killed_grading_worker():
    # the pool's deadline (3 s) comes before the sandbox's own (20 s): the worker is killed
    # mid-run, and the sandboxed program must go with it rather than sleep on
    require_sandbox()
    with GraderPool(1, timeout_s=3.0) as short_pool:
        short_pool.grade(code_reward, [HONEST], [example()])  # the worker up: its folder is known
        folders = worker_temp_dirs(short_pool)
        result = short_pool.grade(code_reward, [fenced("import time\ntime.sleep(30)")],
                                  [example(wall_s=20.0, cpu_s=20)])
        assert result.statuses == ("timeout",)
        deadline = time.monotonic() + 5
        while sandbox_processes_under(folders) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert sandbox_processes_under(folders) == []
