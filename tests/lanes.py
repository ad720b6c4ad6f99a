"""`make test`'s runner: the test folders in LANES concurrent lanes, one pytest process per
folder as before (memory is released between folders).

    python -m tests.lanes RECORD_DIR --lanes 2 [--xdist tests/core/ ...] -- PYTEST_ARGS...

Why lanes: a folder's pytest process keeps about 1.2 of the CI machine's 2 cores busy (XLA
compiles one program at a time, the tiny models run short single-threaded programs, vLLM tests
wait on a server), so make test ran at 124 % CPU. Two lanes fill the second core. Each lane
takes the next folder from one queue, longest first (FOLDER_MINUTES: the two-lane fresh-clone
run of 2026-11-29 at 175273d, docs/benchmarks.md), so tests/train/ (the longest) starts at once and the other
lane works through the rest beside it.

Each folder's output is printed whole when it finishes (lanes never interleave lines). Each lane
has its own record (RECORD_DIR/lane-N: current_folder, current_test, durations.tsv (see
tests/conftest.py) and each folder's output as it is written, tests_<folder>.log), so .ci/run can
name what every lane was running when stopped and show the end of its output. Exit status 1
when any folder failed, and the failed folders are named.
"""
from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

FOLDER_MINUTES = {"tests/train/": 17.2, "tests/rollout/": 13.0, "tests/models/": 4.1, "tests/envs/": 2.7,
                  "tests/core/": 2.3, "tests/cli/": 1.9, "tests/bridge/": 1.7, "tests/serve/": 1.4,
                  "tests/experiments/": 0.9, "tests/launch/": 0.8, "tests/rewards/": 0.8, "tests/tpu/": 0.7,
                  "tests/data/": 0.4}


class FolderResult(NamedTuple):
    folder: str
    lane: int
    returncode: int
    seconds: float
    output: str


def longest_first(folders: list[str]) -> list[str]:
    """Folders by their last measured minutes, longest first; unmeasured ones (a new folder)
    count 1 minute; ties keep alphabetical order."""
    return sorted(sorted(folders), key=lambda f: -FOLDER_MINUTES.get(f, 1.0))


def passed(returncode: int, folder: str, slow_only: set[str]) -> bool:
    """pytest's 5 (nothing collected after `-m "not slow"`) passes only for SLOW_ONLY folders."""
    return returncode == 0 or (returncode == 5 and folder.rstrip("/") in slow_only)


def run_folder(folder: str, lane: int, record: Path, pytest_args: list[str], xdist: set[str],
               xdist_args: list[str]) -> FolderResult:
    (record / "current_folder").write_text(folder + "\n")
    (record / "current_test").unlink(missing_ok=True)
    args = [sys.executable, "-m", "pytest", *pytest_args, *(xdist_args if folder in xdist else []), folder]
    env = {**os.environ, "JAXRL_TEST_RECORD": str(record)}
    log = record / (folder.strip("/").replace("/", "_") + ".log")
    start = time.monotonic()
    with open(log, "w") as out:  # streamed: .ci/run shows its tail when the overall limit stops a run
        returncode = subprocess.run(args, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return FolderResult(folder, lane, returncode, time.monotonic() - start, log.read_text())


def run_lanes(folders: list[str], lanes: int, record_dir: Path, pytest_args: list[str], xdist: set[str],
              xdist_args: list[str]) -> list[FolderResult]:
    todo: queue.Queue[str] = queue.Queue()
    for folder in longest_first(folders):
        todo.put(folder)
    results: list[FolderResult] = []
    print_lock = threading.Lock()

    def lane_worker(lane: int) -> None:
        record = record_dir / f"lane-{lane}"
        record.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                folder = todo.get_nowait()
            except queue.Empty:
                return
            result = run_folder(folder, lane, record, pytest_args, xdist, xdist_args)
            with print_lock:
                results.append(result)
                print(f"== {folder} (lane {lane}, {result.seconds / 60:.1f} min, exit {result.returncode})")
                print(result.output, end="" if result.output.endswith("\n") else "\n", flush=True)

    threads = [threading.Thread(target=lane_worker, args=(lane,)) for lane in range(1, lanes + 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("record_dir", type=Path)
    parser.add_argument("--lanes", type=int, default=2)
    parser.add_argument("--folders", nargs="+", required=True)
    parser.add_argument("--xdist", nargs="*", default=[], help="folders that get XDIST_ARGS")
    parser.add_argument("--xdist-args", default="-n 2 --dist loadfile")
    parser.add_argument("--slow-only", nargs="*", default=[])
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    args = parser.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    if args.lanes < 1:
        parser.error(f"--lanes must be >= 1, got {args.lanes}")
    results = run_lanes(args.folders, args.lanes, args.record_dir, pytest_args, set(args.xdist),
                        args.xdist_args.split())
    failed = [r.folder for r in results if not passed(r.returncode, r.folder, {s.rstrip("/") for s in args.slow_only})]
    print("== folders (min): " + ", ".join(f"{r.folder} {r.seconds / 60:.1f} (lane {r.lane})"
                                          for r in sorted(results, key=lambda r: r.folder)))
    if failed:
        print("make test: FAILED in " + " ".join(sorted(failed)))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
