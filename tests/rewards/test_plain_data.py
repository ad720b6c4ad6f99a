"""The plain-data wire format between a sandboxed program and its grader (rewards/plain_data.py)."""
import math

import pytest

from jaxrl_llm.rewards.plain_data import NotPlainData, decode, encode, plain_equal


def nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_wire_text_by_hand():
    value = (1, {"a": [True, None]}, {2}, frozenset(), 0.5, math.inf)
    text = '{"tuple":[1,{"dict":[["a",[true,null]]]},{"set":[2]},{"frozenset":[]},0.5,{"float":"inf"}]}'
    assert encode(value) == text
    back = decode(text)
    assert plain_equal(back, value) and type(back[1]) is dict and type(back[2]) is set


@pytest.mark.parametrize("value, message", [
    (type("S", (str,), {})("x"), "S is not plain data"),
    (object(), "builtins.object is not plain data"),
    (b"bytes", "builtins.bytes is not plain data"),
    (nested(70), "nested deeper than 64 levels"),
])
def test_only_exact_plain_types_encode(value, message):
    with pytest.raises(NotPlainData, match=message):
        encode(value)


@pytest.mark.parametrize("text", [
    '{"tuple": [1], "x": 2}',        # two keys: not a tag
    '{"eq": "always"}',              # an unknown tag
    "NaN",                           # bare non-finite floats are refused (they travel tagged)
    '{"dict": [[[1], 2]]}',          # an unhashable key
    '{"set": [[1]]}',                # an unhashable element
    "[" * 100000 + "]" * 100000,     # a decoder bomb
    '{"float": "1e400"}',            # only nan / inf / -inf are tagged floats
    "1" * 5000,                      # past Python's 4300-digit int limit
    "not json",
])
def test_anything_else_on_the_wire_is_refused(text):
    with pytest.raises(NotPlainData):
        decode(text)


@pytest.mark.parametrize("a, b, equal", [
    (True, 1, False), (1, 1.0, False), ((1,), [1], False), ({1: "a"}, {True: "a"}, False),
    ({1, 2}, frozenset({1, 2}), False), ([1, (2, "x")], [1, (2, "x")], True), (math.nan, math.nan, True),
    ({"k": [0.1 + 0.2]}, {"k": [0.3]}, False),
])
def test_type_exact_equality(a, b, equal):
    assert plain_equal(a, b) is equal


def test_float_tolerance_is_absolute_and_only_for_floats():
    assert plain_equal([0.1 + 0.2], [0.3], tolerance=1e-9) and not plain_equal(0.31, 0.3, tolerance=1e-9)
    assert not plain_equal(1, 2, tolerance=5.0)  # ints are exact whatever the tolerance
