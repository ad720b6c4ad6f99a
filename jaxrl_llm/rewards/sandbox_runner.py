"""The script that runs INSIDE the sandbox (stdlib only; never imported by the grader).

It reads the job file ``/job/job.json`` ({"program": str, "tests": [str, ...]}), runs the
program's code in a fresh namespace, then each test's code in a copy of that namespace, and
reports one line per test on file descriptor 3: ``PASS <i>`` or ``FAIL <i>``. A test passes
when its code runs to the end without raising (tests are ``assert`` statements). Whatever the
program prints goes to stdout/stderr, which the grader caps and keeps only for diagnostics.

The program runs in the same interpreter as this loop, so code written to forge reports can
do so; the sandbox protects the machine and the run, not the honesty of the score (see
docs/architecture.md, "Code execution sandbox").
"""
import json
import os
import sys


def report(fd, line):
    os.write(fd, (line + "\n").encode())


def run_code(source, namespace, name):
    try:
        exec(compile(source, name, "exec"), namespace)
    except BaseException as exc:  # SystemExit, KeyboardInterrupt from the program count as failure
        print(f"{name}: {type(exc).__name__}: {exc}"[:300], file=sys.stderr)
        return False
    return True


def main():
    report_fd = int(os.environ.pop("JAXRL_REPORT_FD"))
    with open("/job/job.json", encoding="utf-8") as handle:
        job = json.load(handle)
    namespace = {"__name__": "__main__"}
    if not run_code(job["program"], namespace, "<program>"):
        for index in range(len(job["tests"])):
            report(report_fd, f"FAIL {index}")
        return
    for index, test in enumerate(job["tests"]):
        passed = run_code(test, dict(namespace), f"<test {index}>")
        report(report_fd, f"{'PASS' if passed else 'FAIL'} {index}")


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: threads or atexit hooks the program left behind
