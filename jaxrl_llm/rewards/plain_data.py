"""Plain data: the only values that cross between a sandboxed program and its grader.

Plain data is None, bool, int, float, str, and list, tuple, dict, set, frozenset of plain data,
each of exactly that type (a subclass of str or int is not plain). On the wire it is one JSON
text in which lists are JSON arrays and the rest are tagged objects:
``{"tuple": [...]}``, ``{"dict": [[key, value], ...]}``, ``{"set": [...]}``,
``{"frozenset": [...]}``; a float that JSON cannot hold is ``{"float": "nan" | "inf" | "-inf"}``.

Stdlib only: the sandbox runner imports this file too (it is copied into the job folder), and
the grader imports it to encode call arguments and decode results. The grader never trusts
what the sandbox's copy produced: :func:`decode` accepts only the format above (no other
object shape, at most ``MAX_DEPTH`` levels, integers of at most 4300 digits), and builds
fresh built-in values, so nothing of the program's objects (its ``__eq__``, its subclasses)
reaches the grader. :func:`plain_equal` is the grader's type-exact equality.
"""
import json
import math

MAX_DEPTH = 64
_TAGGED = {tuple: "tuple", set: "set", frozenset: "frozenset"}
_UNTAG = {"tuple": tuple, "set": set, "frozenset": frozenset}
_SPECIAL_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class NotPlainData(ValueError):
    """A value (or a wire text) that is not plain data; the message names what was found."""


def to_wire(value, depth=0):
    """``value`` as the JSON-ready tagged form; NotPlainData for anything else (exact types only)."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"float": repr(value)}
    if kind is list:
        return [to_wire(item, depth + 1) for item in value]
    if kind in _TAGGED:
        return {_TAGGED[kind]: [to_wire(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[to_wire(k, depth + 1), to_wire(v, depth + 1)] for k, v in value.items()]}
    raise NotPlainData(f"a {kind.__module__}.{kind.__qualname__} is not plain data")


def encode(value) -> str:
    """The wire text of a plain value (NotPlainData for anything else)."""
    return json.dumps(to_wire(value), separators=(",", ":"))


def from_wire(item, depth=0):
    """The plain value of a parsed wire item; NotPlainData on any other shape."""
    if depth > MAX_DEPTH:
        raise NotPlainData(f"nested deeper than {MAX_DEPTH} levels")
    kind = type(item)
    if item is None or kind in (bool, int, str):
        return item
    if kind is float:
        if not math.isfinite(item):
            raise NotPlainData("a bare non-finite float (they travel tagged)")
        return item
    if kind is list:
        return [from_wire(x, depth + 1) for x in item]
    if kind is dict and len(item) == 1:
        (tag, body), = item.items()
        if tag == "float" and body in _SPECIAL_FLOATS:
            return _SPECIAL_FLOATS[body]
        if type(body) is list:
            try:
                if tag in _UNTAG:
                    return _UNTAG[tag](from_wire(x, depth + 1) for x in body)
                if tag == "dict" and all(type(pair) is list and len(pair) == 2 for pair in body):
                    return {from_wire(k, depth + 1): from_wire(v, depth + 1) for k, v in body}
            except TypeError as exc:  # an unhashable key or set element
                raise NotPlainData(f"bad {tag}: {exc}") from None
    raise NotPlainData(f"not a plain-data wire item: {json.dumps(item)[:80]}")


def decode(text: str):
    """The plain value of a wire text; NotPlainData for any other text."""
    try:
        item = json.loads(text, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:
        raise NotPlainData(f"not JSON: {exc}"[:200]) from None
    try:
        return from_wire(item)
    except RecursionError:
        raise NotPlainData("nested too deep") from None


def _no_constant(name):
    raise ValueError(f"bare {name} (non-finite floats travel tagged)")


def plain_equal(a, b, tolerance: float = 0.0) -> bool:
    """Type-exact equality of plain values: same type at every level (True is not 1, 1 is not
    1.0, a tuple is not a list); floats within ``tolerance`` (absolute), NaN equal to NaN."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= tolerance
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(plain_equal(x, y, tolerance) for x, y in zip(a, b))
    if type(a) is dict:
        return _same_reprs(a, b) and all(plain_equal(v, b[k], tolerance) for k, v in a.items())
    if type(a) in (set, frozenset):
        return _same_reprs(a, b)
    return a == b


def _same_reprs(a, b) -> bool:
    """Keys (or elements) equal by repr, which tells 1, 1.0, True and '1' apart."""
    return sorted(map(repr, a)) == sorted(map(repr, b))
