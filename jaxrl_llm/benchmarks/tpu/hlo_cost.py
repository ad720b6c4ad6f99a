"""FLOPs, HBM bytes and collectives of a compiled XLA program, counted through its loops.

XLA's ``cost_analysis()`` counts a while loop's body once, whatever its trip count: with the
decoder's layers in a loop (and the learner's micro-batches in another) it under-counts a step
many times over. This module reads the compiled program's HLO text (``compiled.as_text()``) and
counts each instruction as often as it runs: a while loop's body (and condition) times its trip
count, nested loops multiplied, a conditional's costliest branch (the learner's micro-batch
``lax.cond`` runs its compute branch for every micro-batch that holds a row).

Trip counts are read from the HLO (`hlo_text.trip_count`); a loop whose count cannot be read (the
sampler's ``while any(slot busy)``) counts once and is listed in ``unknown_loops``.

What is counted:

* ``flops``: 2 x the multiply-adds of every ``dot`` and ``convolution`` (inside fusions too),
  i.e. matrix FLOPs; elementwise work is not counted (XLA's own figure, which counts it, is kept
  beside as ``xla_flops``, once per loop body).
* ``hbm_bytes``: for every instruction outside fusions, the bytes of its operands and results,
  with in-place and sliced accesses counted as XLA's cost model does: a dynamic-slice or gather
  reads only its result's bytes, a dynamic-update-slice or scatter writes only its update (its
  buffer is updated in place), and a fusion parameter read only through such slices counts only them.
  Arrays in TPU's on-chip memory spaces (layout ``S(n)``, n >= 1) are not HBM traffic.
  Bookkeeping ops (parameter, tuple, get-tuple-element, bitcast, constant, loop and call
  wrappers, ``*-done`` halves of async pairs) move nothing.
* ``collectives``: per kind (all-gather, all-reduce, reduce-scatter, all-to-all,
  collective-permute), how many run and their bytes: the larger of the operand and result
  (the gathered or reduced buffer), and ``ici_bytes``, what one chip sends over the interconnect
  in a ring: (n-1)/n of that for all-gather / reduce-scatter / all-to-all, 2(n-1)/n for
  all-reduce, all of it for collective-permute (n: the replica group's size).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from jaxrl_llm.benchmarks.tpu.hlo_text import (Computation, Instr, attr, called, dims, parse_module, shape_bytes,
                                               split_top, trip_count)

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
FREE_OPS = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "conditional", "call",
            "after-all", "partition-id", "replica-id", "iota", "opt-barrier", "add-dependency", "domain"}
SLICING = {"dynamic-slice", "slice", "gather"}
IN_PLACE = {"dynamic-update-slice": 1, "scatter": 2}  # opcode -> operand holding the update (operand 0: the buffer)
def dot_flops(instr: Instr, shapes: dict[str, str]) -> float:
    """2 x multiply-adds of a dot or convolution (``shapes``: the names' result types)."""
    out = math.prod(dims(instr.shape))
    if instr.opcode == "dot":
        lhs = dims(shapes.get(instr.operands[0], ""))
        contracting = attr(instr.attrs, "lhs_contracting_dims") or "{}"
        k = math.prod(lhs[int(d)] for d in contracting.strip("{}").split(",") if d.strip())
        return 2.0 * out * k
    lhs, kernel = dims(shapes.get(instr.operands[0], "")), dims(shapes.get(instr.operands[1], ""))
    labels = re.search(r"dim_labels=(\w+)_(\w+)->", instr.attrs)
    if labels is None or not kernel:
        return 0.0
    lhs_labels, kernel_labels = labels.groups()
    window = _window(instr.attrs, sum(ch.isdigit() for ch in kernel_labels))
    taps = 1.0
    for d, size in enumerate(window["size"]):
        in_size = lhs[lhs_labels.index(str(d))]
        taps *= _real_taps(in_size, size, window["stride"][d], window["pad"][d], window["lhs_dilate"][d],
                           window["rhs_dilate"][d])
    return 2.0 * out * kernel[kernel_labels.index("i")] * taps


def _window(attrs: str, rank: int) -> dict:
    """A convolution's window (size, stride, pad, lhs/rhs dilation per spatial dim; XLA's defaults)."""
    match = re.search(r"window=\{([^}]*)\}", attrs)
    fields = dict(item.split("=", 1) for item in match.group(1).split()) if match else {}

    def ints(key, default):
        return [int(v) for v in fields[key].split("x")] if key in fields else [default] * rank

    pads = [tuple(int(v) for v in p.split("_")) for p in fields["pad"].split("x")] if "pad" in fields else [(0, 0)] * rank
    return {"size": ints("size", 1), "stride": ints("stride", 1), "pad": pads, "lhs_dilate": ints("lhs_dilate", 1),
            "rhs_dilate": ints("rhs_dilate", 1)}


def _real_taps(in_size: int, size: int, stride: int, pad: tuple[int, int], lhs_dilate: int, rhs_dilate: int) -> float:
    """Mean over output positions of the window taps that land on a real input element (not padding,
    not a hole of lhs dilation): TPU programs write batched matmuls as convolutions whose dilated
    windows touch one real element per batch index."""
    dilated = (in_size - 1) * lhs_dilate + 1
    span = (size - 1) * rhs_dilate + 1
    outputs = (pad[0] + dilated + pad[1] - span) // stride + 1
    if outputs <= 0:
        return 0.0
    if outputs * size > 10_000_000:  # too many to walk: every tap counted
        return float(size)
    real = 0
    for j in range(outputs):
        for t in range(size):
            offset = j * stride + t * rhs_dilate - pad[0]
            real += offset >= 0 and offset % lhs_dilate == 0 and offset // lhs_dilate < in_size
    return real / outputs


def _group_size(attrs: str, default: int) -> int:
    iota = re.search(r"replica_groups=\[(\d+),(\d+)\]", attrs)
    if iota:
        return int(iota.group(2))
    groups = re.search(r"replica_groups=\{\{([^}]*)\}", attrs)
    if groups:
        return len([g for g in groups.group(1).split(",") if g.strip()])
    pairs = re.search(r"source_target_pairs=\{([^=]*)\}", attrs)
    return 2 if pairs else default


@dataclass
class Cost:
    """Counts through loops (see the module doc)."""

    flops: float = 0.0
    hbm_bytes: float = 0.0
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    unknown_loops: list[str] = field(default_factory=list)
    loops: list[dict] = field(default_factory=list)

    def add(self, other: "Cost", times: float = 1.0) -> None:
        self.flops += other.flops * times
        self.hbm_bytes += other.hbm_bytes * times
        for kind, row in other.collectives.items():
            mine = self.collectives.setdefault(kind, {"count": 0.0, "bytes": 0.0, "ici_bytes": 0.0})
            for key, value in row.items():
                mine[key] += value * times
        self.unknown_loops += [n for n in other.unknown_loops if n not in self.unknown_loops]
        self.loops += other.loops

    def as_dict(self) -> dict:
        return {"flops": self.flops, "hbm_bytes": self.hbm_bytes,
                "collectives": {k: {kk: float(vv) for kk, vv in v.items()} for k, v in sorted(self.collectives.items())},
                "unknown_loops": list(self.unknown_loops), "loops": list(self.loops)}


class _Counter:
    def __init__(self, comps: dict[str, Computation], partitions: int):
        self.comps = comps
        self.partitions = partitions
        self.shapes = {i.name: i.shape for c in comps.values() for i in c.instrs}
        self._memo: dict[str, Cost] = {}

    def computation(self, name: str) -> Cost:
        if name not in self._memo:
            self._memo[name] = self._count(self.comps[name])
        return self._memo[name]

    def fused_flops(self, name: str) -> float:
        comp = self.comps[name]
        total = 0.0
        for instr in comp.instrs:
            if instr.opcode in ("dot", "convolution"):
                total += dot_flops(instr, self.shapes)
            elif instr.opcode == "fusion" or instr.opcode == "call":
                total += sum(self.fused_flops(c) for c in called(instr) if c in self.comps)
        return total

    def _param_read(self, comp: Computation, param: str, seen: int = 0) -> float:
        """HBM bytes a fused computation reads of its parameter ``param``."""
        users = [i for i in comp.instrs if param in i.operands]
        total = 0.0
        for user in users:
            if user.opcode in SLICING and user.operands[0] == param:
                total += shape_bytes(user.shape, hbm_only=False)
            elif user.opcode in IN_PLACE and user.operands[0] == param:
                continue  # updated in place: the buffer is not read
            elif user.opcode == "tuple" and user.root:
                continue  # passed through to the fusion's output untouched (an async collective's buffer)
            elif user.opcode == "bitcast" and seen < 4:
                total += self._param_read(comp, user.name, seen + 1)
            elif user.opcode == "fusion" and seen < 4 and called(user) and called(user)[0] in self.comps:
                inner = self.comps[called(user)[0]]
                total += sum(self._param_read(inner, inner.params[k], seen + 1)
                             for k, o in enumerate(user.operands) if o == param and k in inner.params)
            else:
                return shape_bytes(self.shapes[param], hbm_only=False)
        return min(total, shape_bytes(self.shapes[param], hbm_only=False))

    def _fusion_bytes(self, instr: Instr) -> float:
        callees = [c for c in called(instr) if c in self.comps]
        if not callees:
            return self._plain_bytes(instr)
        comp = self.comps[callees[0]]
        total = 0.0
        for number, operand in enumerate(instr.operands):
            if shape_bytes(self.shapes.get(operand, ""), hbm_only=True) == 0:
                continue
            param = comp.params.get(number)
            total += self._param_read(comp, param) if param else shape_bytes(self.shapes.get(operand, ""), True)
        root = comp.root
        outputs = [comp.by_name().get(o) for o in root.operands] if root.opcode == "tuple" else [root]
        out_shapes = split_top(instr.shape[1:-1]) if instr.shape.startswith("(") else [instr.shape]
        for out, shape in zip(outputs, out_shapes):
            if shape_bytes(shape, hbm_only=True) == 0 or out is None or out.opcode == "parameter":
                continue  # on-chip, or a parameter passed through
            if out.opcode in COLLECTIVES:
                continue  # a fused collective's result: counted once per channel (`_fused_collectives`)
            if out is not None and out.opcode in IN_PLACE:
                total += shape_bytes(self.shapes.get(out.operands[IN_PLACE[out.opcode]], ""))
            else:
                total += shape_bytes(shape)
        return total

    def _plain_bytes(self, instr: Instr) -> float:
        if instr.opcode in SLICING:
            return 2 * shape_bytes(instr.shape, hbm_only=True)
        if instr.opcode in IN_PLACE:  # the update read and written; the buffer is updated in place
            return 2 * shape_bytes(self.shapes.get(instr.operands[IN_PLACE[instr.opcode]], ""), hbm_only=True)
        if instr.opcode.endswith("-start") and instr.shape.startswith("("):
            # async pair: the start's tuple holds operand(s) and result (and context): operand + result once,
            # a slice's result twice (it reads only what it returns)
            parts = split_top(instr.shape[1:-1])
            if instr.opcode[:-len("-start")] in SLICING and len(parts) > 1:
                return 2 * shape_bytes(parts[1], hbm_only=True)
            return sum(shape_bytes(p, hbm_only=True) for p in parts[:2])
        operands = sum(shape_bytes(self.shapes.get(o, ""), hbm_only=True) for o in instr.operands)
        return operands + shape_bytes(instr.shape, hbm_only=True)

    def _count(self, comp: Computation) -> Cost:
        cost = Cost()
        for instr in comp.instrs:
            op = instr.opcode
            if op == "while":
                body, cond = attr(instr.attrs, "body"), attr(instr.attrs, "condition")
                trips = trip_count(instr, self.comps, comp)
                if trips is None:
                    cost.unknown_loops.append(instr.name)
                cost.loops.append({"name": instr.name, "trip_count": trips})
                cost.add(self.computation(body), trips if trips is not None else 1)
                cost.add(self.computation(cond), (trips + 1) if trips is not None else 1)
                continue
            if op == "conditional":
                branches = [self.computation(c) for c in called(instr) if c in self.comps]
                if branches:
                    cost.add(max(branches, key=lambda c: (c.flops, c.hbm_bytes)))
                continue
            if op == "call":
                for c in called(instr):
                    if c in self.comps:
                        cost.add(self.computation(c))
                continue
            if op in FREE_OPS or op.endswith("-done"):
                continue
            kind = op[:-len("-start")] if op.endswith("-start") else op
            if kind in COLLECTIVES:
                self._collective(cost, instr, kind)
            if op == "fusion":
                cost.flops += sum(self.fused_flops(c) for c in called(instr) if c in self.comps)
                cost.hbm_bytes += self._fusion_bytes(instr)
            else:
                if op in ("dot", "convolution"):
                    cost.flops += dot_flops(instr, self.shapes)
                cost.hbm_bytes += self._plain_bytes(instr)
        return cost

    def fused_collectives(self) -> Cost:
        """Collectives inside fusions (TPU's async collective fusions: XLA splits one collective into
        pieces across several fusions, in and around loops, each holding the same instruction):
        each channel id counted once for the program, its result written to HBM once."""
        cost, channels = Cost(), set()
        fused = {c for comp in self.comps.values() for i in comp.instrs if i.opcode == "fusion" for c in called(i)}
        for name in sorted(fused & set(self.comps)):
            for inner in self.comps[name].instrs:
                kind = inner.opcode[:-len("-start")] if inner.opcode.endswith("-start") else inner.opcode
                channel = attr(inner.attrs, "channel_id") or inner.name
                if kind in COLLECTIVES and channel not in channels:
                    channels.add(channel)
                    self._collective(cost, inner, kind)
                    cost.hbm_bytes += shape_bytes(inner.shape, hbm_only=True)
        return cost

    def _collective(self, cost: Cost, instr: Instr, kind: str) -> None:
        result = instr.shape
        if instr.opcode.endswith("-start") and result.startswith("("):
            parts = split_top(result[1:-1])
            result = parts[1] if len(parts) > 1 else parts[0]
        operand = sum(shape_bytes(self.shapes.get(o, "")) for o in instr.operands)
        size = max(operand, shape_bytes(result))
        n = _group_size(instr.attrs, self.partitions)
        share = {"all-reduce": 2 * (n - 1) / n, "collective-permute": 1.0}.get(kind, (n - 1) / n) if n > 1 else 0.0
        row = cost.collectives.setdefault(kind, {"count": 0.0, "bytes": 0.0, "ici_bytes": 0.0})
        row["count"] += 1
        row["bytes"] += size
        row["ici_bytes"] += size * share


def program_cost(hlo_text: str) -> Cost:
    """The loop-aware `Cost` of one device's program (``compiled.as_text()``)."""
    comps = parse_module(hlo_text)
    partitions = int((re.search(r"num_partitions=(\d+)", hlo_text) or [0, 1])[1])
    counter = _Counter(comps, partitions)
    cost = Cost()
    cost.add(counter.computation(comps["__entry__"].name))
    cost.add(counter.fused_collectives())
    return cost
