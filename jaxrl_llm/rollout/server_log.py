"""Reading a vLLM server's log: why a start failed, and which exception killed a running
server (the last traceback's exception line, per process), with what to change."""
from __future__ import annotations

import re

# Log lines that explain a failed start better than a generic "exited".
START_DIAGNOSES = (
    ("address already in use", "port {port} on {host} is already in use"),
    ("errno 98", "port {port} on {host} is already in use"),
    ("no such file or directory", "a path does not exist (model directory {model_dir}?)"),
    ("is not a valid model", "model directory {model_dir} is not a valid HF model"),
    ("out of memory", "out of memory (lower kv_cache_gib or max_model_len)"),
)


# vLLM's log line prefix: "(EngineCore pid=12) ERROR 11-23 12:02:39 [core.py:1512] ".
_LOG_PREFIX = re.compile(r"^(?:\((?P<proc>[^)]*)\) )?"
                         r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) +"
                         r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? +\[[^\]]*\] ?)?")
# Exceptions that only point at another traceback ("see stack trace above").
_WRAPPER_EXCEPTION = re.compile(r"stack trace|EngineDeadError", re.IGNORECASE)
# Causes the log names, and what to change.
_CRASH_HINTS = (
    ("CPU Generator does not use offset",
     "a seeded request's prefill was split over scheduler steps (chunked prefill) on a CPU server; "
     "start it with VLLMServerConfig(chunked_prefill=False), the default"),
    ("out of memory", "out of memory; lower kv_cache_gib, max_model_len or the batch size"),
)


def exception_lines(log_text: str) -> list[str]:
    """The final line ("RuntimeError: ...") of every Python traceback in a
    server log, in order. vLLM's line prefixes are removed, and tracebacks of
    different processes may interleave: each process is followed separately."""
    in_traceback: dict[str, bool] = {}
    found = []
    for raw in log_text.splitlines():
        prefix = _LOG_PREFIX.match(raw)
        process, message = prefix.group("proc") or "", raw[prefix.end():]
        if message.startswith("Traceback (most recent call last):"):
            in_traceback[process] = True
        elif in_traceback.get(process) and message and not message[0].isspace():
            in_traceback[process] = False  # frames are indented; the exception line is not
            found.append(message.strip())
    return found


def last_exception_line(log_text: str) -> str | None:
    """The exception that explains a crash: the last traceback's exception
    line, skipping those that only refer to an earlier traceback (vLLM's
    EngineDeadError, "Worker failed ..., check the stack trace above");
    None when the log has no traceback (e.g. the server was SIGKILLed)."""
    lines = exception_lines(log_text)
    causes = [line for line in lines if not _WRAPPER_EXCEPTION.search(line)]
    return (causes or lines or [None])[-1]


def crash_hint(cause: str | None) -> str | None:
    """What to change for a known crash cause, or None."""
    for needle, hint in _CRASH_HINTS:
        if cause and needle.lower() in cause.lower():
            return hint
    return None
