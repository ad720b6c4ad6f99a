"""GEM's Python tool with the code run in the project's bubblewrap sandbox (rewards/sandbox.py).

GEM's ``PythonCodeTool`` parses ``<python>...</python>`` or a ```` ```python ```` block from
the model's turn and runs it with ``gem.utils.sandbox.run_python``, whose default
``sandbox_type="none"`` is a plain ``python -c`` subprocess guarded by a string match on
imports. :class:`SandboxPythonTool` keeps GEM's parsing, instructions and observation text
("Code execution result: ...") and runs the code with :func:`jaxrl_llm.rewards.run_calls`
instead: no network, no file system outside its own /tmp, CPU, memory, process and output
limits (``task.kwargs.sandbox``, the code tasks' :class:`SandboxLimits`).

Differences from GEM's tool, by design: stdout and stderr come back as one stream (the
sandbox merges them, in order); a run is successful when the code ran to its end without
raising (``SystemExit`` included: a function defined after the code is then called); GEM's second attempt with its preset imports (numpy,
pandas, ...) prepended is not made, since the sandbox's Python has the standard library only.

The sandbox is started from a worker process (one per trainer, ``forkserver``: started from a
single-threaded server, as the grading pool's workers are), not from the trainer itself:
starting a subprocess with a ``preexec_fn`` (the sandbox's rlimits) forks the caller, which
is unsafe in a multithreaded process such as a JAX program.

This module imports ``gem``; :mod:`jaxrl_llm.data.gem_envs` imports it only when a task asks
for tools.
"""
from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing

from gem.tools.python_code_tool import PythonCodeTool

from jaxrl_llm.rewards import Call, SandboxLimits, run_calls

RAN = "__jaxrl_tool_code_ran__"  # a function defined after the model's code: callable iff the code ran to its end



@functools.cache
def sandbox_worker() -> concurrent.futures.ProcessPoolExecutor:
    """The process that starts this trainer's tool sandboxes (started on first use)."""
    return concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("forkserver"))


class SandboxPythonTool(PythonCodeTool):
    """GEM's Python tool, executing in the project's sandbox under ``limits``."""

    def __init__(self, limits: SandboxLimits):
        super().__init__(timeout=limits.wall_s, sandbox_type="jaxrl_llm bubblewrap")
        self.limits = limits

    def execute_action(self, action: str) -> tuple[bool, bool, str, str]:
        """(found a code block, the run failed, observation, the action up to the block's end),
        GEM's BaseTool contract; the observation is "" when the turn holds no code block."""
        code, parsed_action, found = self._parse_action(action)
        if not found:
            return False, True, "", action
        program = f"{code}\n\n\ndef {RAN}():\n    return True\n"
        results, run = sandbox_worker().submit(run_calls, program, [Call(RAN, ())], self.limits).result()
        failed = results[0].error is not None
        output = run.output
        if run.timed_out:
            output += f"\nExecution timed out after {self.limits.wall_s:g} seconds."
        elif run.output_capped:
            output += f"\nOutput cut at {self.limits.output_bytes} bytes."
        return True, failed, "Code execution result: " + output.lstrip(" \n") + "\n", parsed_action
