"""The script that runs INSIDE the sandbox (stdlib only; never imported by the grader).

It runs the program ``/job/program.py`` in a fresh namespace, then answers call requests:
each line read from stdin is ``{"calls": [[function name, wire args], ...]}`` (wire: see
plain_data.py, copied beside this file), and for each such line it writes ONE line on the
result file descriptor: a JSON list with one outcome per call, ``{"value": wire}``,
``{"raised": "<type>: <message>"}`` or ``{"not_plain": "<why>"}``. It exits at the end of
stdin. Whatever the program prints goes to stdout/stderr, kept only for diagnostics.

Nothing here is trusted. The program shares this interpreter and can replace any of it or
write anything on the result descriptor; all it can change that way is the values its own
calls return, which it controls anyway. The job folder holds no test and no expected value:
the grader sends call arguments and compares the values it decodes itself
(jaxrl_llm/rewards/code_grader.py).
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # -I leaves the script's folder off the path
import plain_data  # noqa: E402  (the copy in /job)

MAX_RESULT_CHARS = 1 << 20  # one outcome past this is "not_plain" (the grader reads at most 4 MiB a line)


def run_call(namespace, name, wire_args):
    try:
        function = namespace[name]
        value = function(*plain_data.from_wire(wire_args))
    except BaseException as exc:  # SystemExit from the program is a failed call, like any raise
        return {"raised": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        text = plain_data.encode(value)
    except (plain_data.NotPlainData, RecursionError, ValueError) as exc:
        return {"not_plain": str(exc)[:300]}
    if len(text) > MAX_RESULT_CHARS:
        return {"not_plain": f"a result of {len(text)} characters"}
    return {"value_text": text}


def answer(fd, outcomes):
    parts = [f'{{"value":{o["value_text"]}}}' if "value_text" in o else json.dumps(o) for o in outcomes]
    data = ("[" + ",".join(parts) + "]\n").encode()
    while data:
        data = data[os.write(fd, data):]


def main():
    result_fd = int(os.environ.pop("JAXRL_REPORT_FD"))
    namespace = {"__name__": "__main__"}
    failure = None
    try:
        with open("/job/program.py", encoding="utf-8") as handle:
            exec(compile(handle.read(), "<program>", "exec"), namespace)
    except BaseException as exc:  # the program's own SystemExit, KeyboardInterrupt: every call fails
        failure = {"raised": f"<program>: {type(exc).__name__}: {exc}"[:300]}
        print(failure["raised"], file=sys.stderr)
    for line in sys.stdin:
        calls = json.loads(line)["calls"]
        answer(result_fd, [failure or run_call(namespace, name, args) for name, args in calls])


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: threads or atexit hooks the program left behind
