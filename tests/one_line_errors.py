"""`jaxrl` run as a user runs it, and the answer to a user error: one line on stderr,
"jaxrl <command>: error: ..." naming the problem, exit status 2, no traceback. Informational
"[jaxrl] ..." lines printed before it (the engine chosen, ...) are not part of the error.
The CLI tests of every folder use these helpers."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
CLI = ("-m", "jaxrl_llm.cli")
ERROR_LINE = re.compile(r"jaxrl [\w-]+: error: ")


def without(package: str) -> tuple[str, str]:
    """The entry that runs the CLI as if `package` were not installed (its import fails)."""
    return ("-c", f"import sys; sys.modules[{package!r}] = None; from jaxrl_llm.cli import main; sys.exit(main())")


def start_jaxrl(*args: str, entry: Sequence[str] = CLI, cwd: Path = REPO,
                env: dict[str, str] | None = None) -> subprocess.Popen:
    """`python ENTRY ARGS` from `cwd` with the repository importable; stdout and stderr piped apart.
    `entry`: `-m jaxrl_llm.cli`, or `without(package)`."""
    return subprocess.Popen([sys.executable, *entry, *args], cwd=cwd, env={**os.environ, "PYTHONPATH": str(REPO),
                                                                           **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def jaxrl(*args: str, cwd: Path = REPO, env: dict[str, str] | None = None,
          timeout: float = 300) -> subprocess.CompletedProcess:
    """`jaxrl ARGS` to the end."""
    return finish(start_jaxrl(*args, cwd=cwd, env=env), timeout)


def one_line_error(done: subprocess.CompletedProcess, words: Iterable[str]) -> str:
    """The error line of a finished `jaxrl`, asserting exit status 2, one line besides "[jaxrl]" ones,
    no traceback, and each of `words` in it."""
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("[jaxrl]")]
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert ERROR_LINE.match(lines[0]), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def finish(proc: subprocess.Popen, timeout: float = 300) -> subprocess.CompletedProcess:
    """A started `jaxrl` to its end, as a CompletedProcess."""
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
