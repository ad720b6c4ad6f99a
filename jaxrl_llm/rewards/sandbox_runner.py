"""The script that runs INSIDE the sandbox (stdlib only; never imported by the grader).

It runs the program ``/job/program.py`` in a fresh namespace, then answers call requests:
each line read from stdin is ``{"calls": [[function name, wire args], ...]}`` (wire: see
plain_data.py, copied beside this file), and for each such line it writes ONE line on the
result file descriptor: a JSON list with one outcome per call, ``{"value": wire}``,
``{"raised": "<type>: <message>"}`` or ``{"not_plain": "<why>"}``; a value or not_plain outcome
carries ``"flag": "<why>"`` when the result's class had its own ``__eq__`` (:func:`to_plain`). It exits at the end of
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
# a subclass of one of these travels as its base type's value, read by the base type's own methods
_BASES = ((int, int.__int__), (float, float.__float__), (str, str.__str__), (list, list.__iter__),
          (tuple, tuple.__iter__), (dict, dict.items), (set, set.__iter__), (frozenset, frozenset.__iter__))


def own_equality(kind):
    """Whether ``kind`` compares by an ``__eq__`` or ``__ne__`` the program defined (a class of
    ``__main__`` in its MRO defines it): the mark of an object made to pass an equality test.
    The standard library's own (Counter's, an Enum's) do not count."""
    for name in ("__eq__", "__ne__"):
        owner = next(c for c in kind.__mro__ if name in c.__dict__)
        if owner.__module__ == "__main__":
            return True
    return False


def to_plain(value, flags, depth=0):
    """``value`` as exact plain data: a subclass of a plain type by its base type's value (a
    namedtuple as a tuple, a Counter as a dict); anything else raises NotPlainData. A class with
    its own equality is noted in ``flags`` (the grader counts it as a suspected forgery)."""
    kind = type(value)
    if depth > plain_data.MAX_DEPTH:
        raise plain_data.NotPlainData(f"nested deeper than {plain_data.MAX_DEPTH} levels")
    if value is None or kind in (bool, int, float, str):
        return value
    if kind in (list, tuple, set, frozenset):
        return kind(to_plain(item, flags, depth + 1) for item in value)
    if kind is dict:
        return {to_plain(k, flags, depth + 1): to_plain(v, flags, depth + 1) for k, v in value.items()}
    if own_equality(kind):
        flags.append(f"a {kind.__module__}.{kind.__qualname__} with its own __eq__")
    for base, read in _BASES:
        if isinstance(value, base):
            raw = read(value)
            if base is dict:
                raw = [(k, v) for k, v in raw]
                return {to_plain(k, flags, depth + 1): to_plain(v, flags, depth + 1) for k, v in raw}
            if base in (int, float, str):
                return raw
            return base(to_plain(item, flags, depth + 1) for item in raw)
    raise plain_data.NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def run_call(namespace, name, wire_args):
    """The JSON text of one call's outcome (module doc)."""
    try:
        function = namespace[name]
        value = function(*plain_data.from_wire(wire_args))
    except BaseException as exc:  # SystemExit from the program is a failed call, like any raise
        return json.dumps({"raised": f"{type(exc).__name__}: {exc}"[:300]})
    flags = []
    try:
        text = plain_data.encode(to_plain(value, flags))
        if len(text) > MAX_RESULT_CHARS:
            raise plain_data.NotPlainData(f"a result of {len(text)} characters")
        outcome = '{"value": ' + text
    except BaseException as exc:  # NotPlainData, RecursionError, or the program's own methods raising
        outcome = '{"not_plain": ' + json.dumps(f"{type(exc).__name__}: {exc}"[:300])
    return outcome + (', "flag": ' + json.dumps(flags[0][:300]) if flags else "") + "}"


def answer(fd, outcomes):
    data = ("[" + ",".join(outcomes) + "]\n").encode()
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
        failure = json.dumps({"raised": f"<program>: {type(exc).__name__}: {exc}"[:300]})
        print(failure, file=sys.stderr)
    for line in sys.stdin:
        calls = json.loads(line)["calls"]
        answer(result_fd, [failure or run_call(namespace, name, args) for name, args in calls])


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: threads or atexit hooks the program left behind
