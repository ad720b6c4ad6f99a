"""A compiled XLA program's HLO text (``compiled.as_text()``) as computations of instructions, and
the facts read from it: result types and their bytes, attributes, called computations, and while
loops' trip counts.

Trip counts: XLA's ``known_trip_count`` when the loop carries one; else the canonical counted loop
JAX emits (``i < N`` in the condition on a tuple element that starts at a constant and gains a
constant each iteration). Anything else (the sampler's ``while any(slot busy)``) has none (None).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

DTYPE_BYTES = {"pred": 1, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "s32": 4, "u32": 4,
               "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8, "c64": 8, "c128": 16,
               "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "token": 0}
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s*\((.*)\)\s*->\s*(.*)\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")


@dataclass
class Instr:
    name: str
    shape: str  # the result type text
    opcode: str
    operands: list[str]
    attrs: str
    root: bool = False


@dataclass
class Computation:
    name: str
    instrs: list[Instr] = field(default_factory=list)
    params: dict[int, str] = field(default_factory=dict)  # parameter number -> instruction name

    def by_name(self) -> dict[str, Instr]:
        return {i.name: i for i in self.instrs}

    @property
    def root(self) -> Instr:
        return next((i for i in self.instrs if i.root), self.instrs[-1])


def _balanced(text: str, start: int, open_char: str = "(", close_char: str = ")") -> int:
    """Index just past the bracket closing the one at ``start``."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_char:
            depth += 1
        elif text[i] == close_char:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced {open_char}{close_char} in HLO text: {text[start:start + 80]!r}")


def split_top(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


def _parse_instr(line: str) -> Instr | None:
    match = _INSTR.match(line)
    if match is None:
        return None
    root, name, rest = bool(match.group(1)), match.group(2), match.group(3)
    if rest.startswith("("):
        end = _balanced(rest, 0)
    else:
        end = rest.index(" ")
    shape, rest = rest[:end], rest[end:].lstrip()
    op_match = re.match(r"([\w\-]+)\(", rest)
    if op_match is None:
        return None
    opcode = op_match.group(1)
    close = _balanced(rest, len(opcode))
    operands = [part.split()[-1].lstrip("%") for part in split_top(rest[len(opcode) + 1:close - 1]) if part]
    return Instr(name, shape, opcode, operands, rest[close:], root)


def parse_module(text: str) -> dict[str, Computation]:
    """Computations by name; the entry one also under the key "__entry__"."""
    comps: dict[str, Computation] = {}
    current = None
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header and not line.startswith("HloModule"):
                current = Computation(header.group(2))
                comps[current.name] = current
                if header.group(1):
                    comps["__entry__"] = current
            continue
        if line.strip() == "}":
            current = None
            continue
        instr = _parse_instr(line)
        if instr is not None:
            current.instrs.append(instr)
            if instr.opcode == "parameter":
                number = re.match(r"\s*(\d+)", instr.attrs) or re.search(r"parameter\((\d+)\)", line)
                current.params[int(number.group(1))] = instr.name
    if "__entry__" not in comps:
        raise ValueError("no ENTRY computation in the HLO text")
    return comps


def shape_bytes(shape: str, hbm_only: bool = False) -> float:
    """Bytes of a result type (tuples summed); ``hbm_only``: arrays in memory spaces S(n >= 1) count 0."""
    total = 0.0
    for dtype, extent, layout in _ARRAY.findall(shape):
        if dtype not in DTYPE_BYTES:
            continue
        if hbm_only and layout and re.search(r"S\(([1-9]\d*)\)", layout):
            continue
        total += DTYPE_BYTES[dtype] * math.prod(int(d) for d in extent.split(",") if d)
    return total


def dims(shape: str) -> list[int]:
    match = _ARRAY.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def attr(attrs: str, key: str) -> str | None:
    match = re.search(rf"\b{key}=(%?[\w.\-]+|\{{[^}}]*\}})", attrs)
    return match.group(1).lstrip("%") if match else None


def called(instr: Instr) -> list[str]:
    names = []
    for key in ("calls", "to_apply", "body", "condition", "true_computation", "false_computation"):
        value = attr(instr.attrs, key)
        if value:
            names.append(value)
    branches = re.search(r"branch_computations=\{([^}]*)\}", instr.attrs)
    if branches:
        names += [b.strip().lstrip("%") for b in branches.group(1).split(",") if b.strip()]
    return names


def _const_int(comp: Computation, name: str, seen: int = 0) -> int | None:
    instr = comp.by_name().get(name)
    if instr is None or seen > 8:
        return None
    if instr.opcode == "constant":
        try:
            return int(instr.operands[0]) if len(instr.operands) == 1 else None
        except ValueError:
            return None
    if instr.opcode in ("copy", "bitcast", "convert", "reshape") and instr.operands:
        return _const_int(comp, instr.operands[0], seen + 1)
    return None


def _tuple_index_source(comp: Computation, name: str) -> int | None:
    """The tuple index of a get-tuple-element of the computation's parameter that ``name`` is (through copies)."""
    instrs = comp.by_name()
    instr = instrs.get(name)
    for _ in range(8):
        if instr is None:
            return None
        if instr.opcode == "get-tuple-element":
            index = attr(instr.attrs, "index")
            return int(index) if index is not None else None
        if instr.opcode in ("copy", "bitcast", "convert") and instr.operands:
            instr = instrs.get(instr.operands[0])
            continue
        return None
    return None


def trip_count(instr: Instr, comps: dict[str, Computation], parent: Computation) -> int | None:
    """The trip count of a while instruction (module doc), or None where it cannot be read."""
    known = re.search(r'"known_trip_count":\{"n":"(\d+)"\}', instr.attrs)
    if known:
        return int(known.group(1))
    cond, body = comps.get(attr(instr.attrs, "condition") or ""), comps.get(attr(instr.attrs, "body") or "")
    if cond is None or body is None:
        return None
    compare = cond.root
    if compare.opcode != "compare" or len(compare.operands) != 2:
        return None
    direction = (re.search(r"direction=(\w+)", compare.attrs) or [None, None])[1]
    lhs_index, rhs_index = (_tuple_index_source(cond, o) for o in compare.operands)
    lhs_const, rhs_const = (_const_int(cond, o) for o in compare.operands)
    if lhs_index is not None and rhs_const is not None and direction in ("LT", "LE"):
        index, bound, inclusive = lhs_index, rhs_const, direction == "LE"
    elif rhs_index is not None and lhs_const is not None and direction in ("GT", "GE"):
        index, bound, inclusive = rhs_index, lhs_const, direction == "GE"
    else:
        return None
    init_tuple = parent.by_name().get(instr.operands[0]) if instr.operands else None
    if init_tuple is None or init_tuple.opcode != "tuple" or index >= len(init_tuple.operands):
        return None
    start = _const_int(parent, init_tuple.operands[index])
    step = _loop_step(body, index)
    if start is None or not step:
        return None
    return max(0, -(-(bound + (1 if inclusive else 0) - start) // step))


def _loop_step(body: Computation, index: int) -> int | None:
    root = body.root
    if root.opcode != "tuple" or index >= len(root.operands):
        return None
    update = body.by_name().get(root.operands[index])
    if update is None or update.opcode != "add":
        return None
    sources = [_tuple_index_source(body, o) for o in update.operands]
    consts = [_const_int(body, o) for o in update.operands]
    if index in sources:
        return consts[1 - sources.index(index)]
    return None
