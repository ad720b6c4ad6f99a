"""The last step of `make test`: no vLLM server started by the suite may still be running.

    python -m tests.leftover_servers RECORD_DIR

`launch_watched` (jaxrl_llm/rollout/vllm_server.py) writes one file per server into
$JAXRL_VLLM_PID_DIR (RECORD_DIR; the Makefile sets it for the whole run): the process group
id, command, working directory and the test that started it. Any live process still in one of
those groups is listed with its command line and working directory, and the exit status is 1.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def live_groups() -> dict[int, list[int]]:
    """Process group id -> the live (not zombie) processes in it."""
    groups: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        state, _ppid, pgrp = stat[stat.rindex(")") + 2:].split()[:3]
        if state != "Z":
            groups.setdefault(int(pgrp), []).append(int(entry))
    return groups


def describe(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return f"pid {pid} (gone)"
    return f"pid {pid}, ppid {Path(f'/proc/{pid}/stat').read_text().rsplit(')', 1)[1].split()[1]}, cwd {cwd}: {command}"


def leftovers(record_dir: Path) -> list[str]:
    groups = live_groups()
    found = []
    for record in sorted(record_dir.iterdir()) if record_dir.is_dir() else ():
        started = json.loads(record.read_text())
        for pid in groups.get(started["pid"], ()):
            found.append(f"{describe(pid)} (started by {started.get('test') or 'no test'}, in {started['cwd']})")
    return found


def main(argv: list[str]) -> int:
    record_dir = Path(argv[0])
    found = leftovers(record_dir)
    if found:
        print(f"vLLM server processes started by this test run are still running ({len(found)}; "
              f"records in {record_dir}):", *found, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
