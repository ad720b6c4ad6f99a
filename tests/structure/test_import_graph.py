"""The package's import graph: no cycles, and every import points down the layer order.

Every module of jaxrl_llm/ (and of the launch/ and experiments/ scripts, which sit on
top of the package) is parsed with `ast`, nothing is imported. An edge A -> B exists
when A imports B anywhere (module level or inside a function):

  import jaxrl_llm.x.y / from jaxrl_llm.x.y import name     -> jaxrl_llm.x.y
  from jaxrl_llm.x import y       (y a submodule)           -> jaxrl_llm.x.y too
  from . import y / from .y import name   (relative)        resolved like the above

and, because importing jaxrl_llm.x.y first runs jaxrl_llm/x/__init__.py, also
A -> jaxrl_llm.x (the package's re-exports are part of the graph), except for the
packages that contain A (they are already initialising when A runs). Imports under
`if TYPE_CHECKING:` never run: they count for the layers but not for cycles.

Layers (LAYERS below, each may import what it names and, transitively, what those may):

  utils < core < models < bridge < rollout < train < reports < benchmarks < cli
          core < rewards < data < train < serve < benchmarks
  launch/, experiments/: scripts outside the package, on top of everything; the package
  must not import them (they are not installed with it).

A new top-level package or module of jaxrl_llm fails `test_every_module_has_a_layer`
until it is placed in LAYERS.

Inside two packages, rooms are checked the same way: train's rooms by stage (TRAIN_ROOMS) and the
benchmarks' rooms by target (BENCHMARK_ROOMS: cpu, gpu, tpu import only common), and no package
module but cli.py imports the benchmarks.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGE = "jaxrl_llm"
APPS = ("launch", "experiments")  # script folders outside the package: the top layer

# layer -> the layers it may import directly (transitively closed in `allowed_layers`).
# The layer of jaxrl_llm.x.y is "x"; of jaxrl_llm/cli.py "cli"; of jaxrl_llm/__init__.py
# "jaxrl_llm" (every import of the package runs it, so it may import nothing of ours, and
# every layer may "import" it).
LAYERS: dict[str, set[str]] = {
    PACKAGE: set(),
    "utils": set(),  # generic helpers, the lowest layer
    "core": {"utils"},
    "rewards": {"core"},  # graders: nothing above core
    "data": {"rewards"},  # tasks name their grader
    "models": {"core"},
    "bridge": {"models"},
    "rollout": {"bridge"},
    "train": {"rollout", "data"},
    "reports": {"train"},
    "benchmarks": {"reports", "serve"},  # a benchmark summarises with reports.stats; it may time the servers
    "serve": {"train"},  # API servers (serve/tinker) over the learner and sampler
    "cli": {"reports", "benchmarks", "serve"},
    "launch": {"cli"},
    "experiments": {"cli"},
}

# The rooms of jaxrl_llm.train, by stage, checked the same way among train's own modules: config
# imports none of them (not even the planner), the sampling stage never imports the learning stage
# (nor the other way), and only run/ joins the two.
TRAIN = f"{PACKAGE}.train"
TRAIN_ROOMS: dict[str, set[str]] = {
    TRAIN: set(),
    "config": set(),  # the schema and its checks
    "policy": set(),  # weights, tokenizer, chat template: both stages use it
    "distributed": set(),  # JAX processes and the mesh: both stages use it
    "plan": {"config"},  # the run planner
    "sample": {"plan", "policy", "distributed"},
    "learn": {"plan", "policy", "distributed"},
    "run": {"sample", "learn"},
}


# --------------------------------------------------------------------------- graph
@dataclasses.dataclass(frozen=True)
class Import:
    """One import statement's edge src -> dst (module names), where it is written."""

    src: str
    dst: str
    path: str  # relative to the repository root
    line: int
    text: str  # the statement, as ast.unparse writes it
    scope: str = ""  # enclosing function, "" at module level
    type_only: bool = False  # under `if TYPE_CHECKING:`
    via: str = ""  # the module the statement names, when dst is a package it runs first

    def where(self) -> str:
        scope = f" (in {self.scope})" if self.scope else ""
        via = f"  [runs {self.dst}'s __init__ first]" if self.via else ""
        return f"{self.path}:{self.line}{scope}: {self.text}{via}"


def discover_modules(repo: Path, package: str = PACKAGE, apps: Sequence[str] = APPS) -> dict[str, Path]:
    """Module name -> file for every .py file under repo/package and repo/<app>."""
    modules: dict[str, Path] = {}
    for top in (package, *apps):
        root = repo / top
        if not root.is_dir():
            continue
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(repo).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


class _ImportCollector(ast.NodeVisitor):
    def __init__(self):
        self.found: list[tuple[ast.Import | ast.ImportFrom, str, bool]] = []
        self._scope: list[str] = []
        self._type_only = 0

    def _visit_scope(self, node):
        self._scope.append(node.name)
        self.generic_visit(node)
        self._scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_scope

    def visit_If(self, node: ast.If):
        test = node.test
        type_checking = (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        )
        self.visit(test)
        self._type_only += type_checking
        for child in node.body:
            self.visit(child)
        self._type_only -= type_checking
        for child in node.orelse:
            self.visit(child)

    def visit_Import(self, node):
        self.found.append((node, ".".join(self._scope), self._type_only > 0))

    visit_ImportFrom = visit_Import


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def build_graph(
    repo: Path, package: str = PACKAGE, apps: Sequence[str] = APPS
) -> tuple[dict[str, Path], list[Import], list[Import]]:
    """(modules, edges, unresolved): every edge between our modules, and the imports of
    jaxrl_llm/app modules that name no existing module (dst is the missing name)."""
    modules = discover_modules(repo, package, apps)
    ours = (package, *apps)
    edges: list[Import] = []
    unresolved: list[Import] = []
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        rel = path.relative_to(repo).as_posix()
        collector = _ImportCollector()
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        for node, scope, type_only in collector.found:
            text = ast.unparse(node)
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base_parts = name.split(".") if is_package else name.split(".")[:-1]
                    if node.level - 1 > len(base_parts) - 1:
                        unresolved.append(Import(name, "." * node.level + (node.module or ""), rel, node.lineno,
                                                 text, scope, type_only))
                        continue
                    base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                    base = ".".join(base_parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                targets = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            for target in targets:
                if target.split(".")[0] not in ours:
                    continue  # standard library / third party / launch's sibling `common`
                if target not in modules:
                    unresolved.append(Import(name, target, rel, node.lineno, text, scope, type_only))
                    continue
                own = set(_ancestors(name)) | {name}
                for dst in [*_ancestors(target), target]:
                    if dst in modules and dst not in own:
                        via = target if dst != target else ""
                        edges.append(Import(name, dst, rel, node.lineno, text, scope, type_only, via))
    return modules, edges, unresolved


# ------------------------------------------------------------------------ checkers
def find_cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The shortest cycle [a, b, ..., a] through each module that is on one, each cycle
    once (Tarjan's strongly connected components, then a breadth-first search in each)."""
    succ = {node: sorted(set(dsts)) for node, dsts in graph.items()}
    for dsts in list(succ.values()):
        for d in dsts:
            succ.setdefault(d, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    for root in sorted(succ):
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            node, i = work.pop()
            if i == 0:
                index[node] = low[node] = len(index)
                stack.append(node)
                on_stack.add(node)
            recurse = False
            for j in range(i, len(succ[node])):
                nxt = succ[node][j]
                if nxt not in index:
                    work.append((node, j + 1))
                    work.append((nxt, 0))
                    recurse = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if recurse:
                continue
            if low[node] == index[node]:
                comp = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.append(top)
                    if top == node:
                        break
                components.append(sorted(comp))
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])

    cycles: list[list[str]] = []
    for comp in sorted(components):
        if len(comp) == 1 and comp[0] not in succ[comp[0]]:
            continue
        members = set(comp)
        for start in comp:  # the shortest cycle through each member, each cycle once
            cycle = _shortest_cycle(start, succ, members)
            k = cycle.index(min(cycle[:-1]))
            cycle = cycle[k:-1] + cycle[:k] + [cycle[k]]  # rotated to start at its smallest name
            if cycle not in cycles:
                cycles.append(cycle)
    return cycles


def _shortest_cycle(start: str, succ: Mapping[str, list[str]], members: set[str]) -> list[str]:
    previous: dict[str, str] = {}
    queue = collections.deque([start])
    while queue:
        node = queue.popleft()
        if start in succ[node]:
            path = [node]
            while path[-1] != start:
                path.append(previous[path[-1]])
            return [*path[::-1], start]  # start, ..., node, start
        for nxt in succ[node]:
            if nxt in members and nxt not in previous and nxt != start:
                previous[nxt] = node
                queue.append(nxt)
    raise AssertionError(f"{start} is in a strongly connected component but on no cycle")


def layer_of(module: str, package: str = PACKAGE) -> str:
    """The layer of `module` inside `package` (its first name below it; `package` itself for its
    __init__); a module outside `package` is its own top-level name (an app folder)."""
    if module != package and not module.startswith(package + "."):
        return module.split(".")[0]
    rest = module[len(package) + 1:].split(".") if module != package else []
    return rest[0] if rest else package


def allowed_layers(layers: Mapping[str, set[str]]) -> dict[str, set[str]]:
    """Each layer's transitive closure of `layers` (itself included)."""
    closed: dict[str, set[str]] = {}
    for layer in layers:
        seen, todo = {layer}, list(layers[layer])
        while todo:
            below = todo.pop()
            if below not in seen:
                seen.add(below)
                todo.extend(layers.get(below, ()))
        closed[layer] = seen
    return closed


def upward_imports(edges: Iterable[Import], layers: Mapping[str, set[str]], package: str = PACKAGE) -> list[Import]:
    """The edges whose target's layer is not below (or equal to) the source's layer."""
    allowed = allowed_layers(layers)
    bad: dict[tuple, Import] = {}
    for edge in edges:
        src, dst = layer_of(edge.src, package), layer_of(edge.dst, package)
        if src in allowed and dst not in allowed[src] and dst != package:  # the root __init__ runs first always
            key = (edge.path, edge.line, edge.text, dst)
            if key not in bad or (bad[key].via and not edge.via):
                bad[key] = edge  # prefer the edge to the module the statement names
    return list(bad.values())


def cycle_report(cycles: list[list[str]], edges: Iterable[Import]) -> str:
    first: dict[tuple[str, str], Import] = {}
    for edge in edges:
        known = first.get((edge.src, edge.dst))
        if not edge.type_only and (known is None or (known.via and not edge.via)):
            first[edge.src, edge.dst] = edge  # prefer the statement that names dst itself
    lines = []
    for cycle in cycles:
        lines.append("import cycle: " + " -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            lines.append(f"    {first[a, b].where()}")
    return "\n".join(lines)


def upward_report(bad: Iterable[Import], layers: Mapping[str, set[str]], package: str = PACKAGE) -> str:
    allowed = allowed_layers(layers)
    lines = []
    for edge in sorted(bad, key=lambda e: (e.path, e.line)):
        src, dst = layer_of(edge.src, package), layer_of(edge.dst, package)
        below = ", ".join(sorted(allowed[src] - {src})) or "nothing of ours"
        lines.append(f"upward import {src} -> {dst}: {edge.where()}\n    ({src} may import only: {below})")
    return "\n".join(lines)


def check(repo: Path, layers: Mapping[str, set[str]] = LAYERS, package: str = PACKAGE,
          apps: Sequence[str] = APPS) -> list[str]:
    """Every problem of the tree at `repo`, one report string each (empty: clean)."""
    modules, edges, unresolved = build_graph(repo, package, apps)
    problems = []
    unplaced = sorted({layer_of(m, package) for m in modules} - set(layers))
    if unplaced:
        problems.append(f"modules with no layer (add them to LAYERS): {unplaced}")
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in edges:
        if not edge.type_only:
            graph[edge.src].add(edge.dst)
    cycles = find_cycles(graph)
    if cycles:
        problems.append(cycle_report(cycles, edges))
    bad = upward_imports(edges, layers, package)
    if bad:
        problems.append(upward_report(bad, layers, package))
    if unresolved:
        problems.append("\n".join(f"import of a missing module {e.dst}: {e.where()}" for e in unresolved))
    return problems


# --------------------------------------------------- the checker on hand-built input
def test_find_cycles_on_hand_built_graph():
    graph = {"a": ["b"], "b": ["c"], "c": ["a", "d"], "d": [], "e": ["e"], "f": ["a"]}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["e", "e"]]
    assert find_cycles({"a": ["b"], "b": ["c"], "c": [], "d": ["a", "c"]}) == []
    # two cycles through one node form one component; both are reported
    assert find_cycles({"a": ["b", "x"], "b": ["a"], "x": ["y"], "y": ["a"]}) == [["a", "b", "a"],
                                                                                 ["a", "x", "y", "a"]]


def test_upward_imports_on_hand_built_edges():
    layers = {"low": set(), "mid": {"low"}, "side": {"low"}, "top": {"mid", "side"}}
    def edge(src, dst, line):
        return Import(f"pkg.{src}.m", f"pkg.{dst}.m", f"pkg/{src}/m.py", line, f"import pkg.{dst}.m")
    edges = [edge("top", "low", 1), edge("mid", "low", 2), edge("mid", "mid", 3),
             edge("low", "mid", 4), edge("mid", "side", 5), edge("side", "top", 6)]
    bad = upward_imports(edges, layers, package="pkg")
    assert [(e.path, e.line) for e in bad] == [("pkg/low/m.py", 4), ("pkg/mid/m.py", 5), ("pkg/side/m.py", 6)]
    report = upward_report(bad, layers, package="pkg")
    assert "upward import low -> mid: pkg/low/m.py:4: import pkg.mid.m" in report
    assert "(side may import only: low)" in report


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_build_graph_resolves_every_import_form(tmp_path):
    _write_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "from pkg.low.a import A\n",
        "pkg/low/a.py": "import os\nA = 1\n",
        "pkg/low/b.py": "from . import a\nfrom .a import A\nimport pkg.low\n",
        "pkg/high/__init__.py": "",
        "pkg/high/c.py": ("from typing import TYPE_CHECKING\n"
                          "from pkg.low import b, A\n"
                          "def f():\n    from ..low.a import A\n"
                          "if TYPE_CHECKING:\n    from pkg.high import d\n"),
        "pkg/high/d.py": "import pkg.nothing_here\n",
        "app/run.py": "from pkg.high.c import f\nfrom helper import x\n",
    })
    modules, edges, unresolved = build_graph(tmp_path, package="pkg", apps=("app",))
    assert set(modules) == {"pkg", "pkg.low", "pkg.low.a", "pkg.low.b", "pkg.high", "pkg.high.c", "pkg.high.d",
                            "app.run"}
    got = {(e.src, e.dst, e.line, e.scope, e.type_only) for e in edges}
    assert got == {
        ("pkg.low", "pkg.low.a", 1, "", False),
        ("pkg.low.b", "pkg.low.a", 1, "", False),  # from . import a
        ("pkg.low.b", "pkg.low.a", 2, "", False),  # from .a import A ; `import pkg.low`: own package, no edge
        ("pkg.high.c", "pkg.low", 2, "", False),  # the package runs first
        ("pkg.high.c", "pkg.low.b", 2, "", False),  # b is a submodule, A is not
        ("pkg.high.c", "pkg.low", 4, "f", False),
        ("pkg.high.c", "pkg.low.a", 4, "f", False),
        ("pkg.high.c", "pkg.high.d", 6, "", True),
        ("app.run", "pkg", 1, "", False),
        ("app.run", "pkg.high", 1, "", False),
        ("app.run", "pkg.high.c", 1, "", False),
    }
    assert [(e.src, e.dst, e.line) for e in unresolved] == [("pkg.high.d", "pkg.nothing_here", 1)]


def test_check_fails_on_a_tree_with_a_cycle_and_an_upward_import(tmp_path):
    """The whole checker on a small package: it must name the file, line and statement."""
    _write_tree(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from pkg.low.b import B\nA = 1\n",
        "pkg/low/b.py": "B = 2\ndef g():\n    from pkg.low import a\n    import pkg.high.c\n",
        "pkg/high/__init__.py": "",
        "pkg/high/c.py": "from pkg.low.a import A\n",
    })
    layers = {"pkg": set(), "low": set(), "high": {"low"}}
    problems = check(tmp_path, layers, package="pkg", apps=())
    report = "\n".join(problems)
    assert "import cycle: pkg.low.a -> pkg.low.b -> pkg.low.a" in report
    assert "pkg/low/a.py:1: from pkg.low.b import B" in report
    assert "pkg/low/b.py:3 (in g): from pkg.low import a" in report
    assert "upward import low -> high: pkg/low/b.py:4 (in g): import pkg.high.c\n" in report
    # and passes once both are gone
    (tmp_path / "pkg/low/b.py").write_text("B = 2\n")
    assert check(tmp_path, layers, package="pkg", apps=()) == []
    # a package nobody placed is a problem of its own
    _write_tree(tmp_path, {"pkg/new/__init__.py": ""})
    assert check(tmp_path, layers, package="pkg", apps=()) == ["modules with no layer (add them to LAYERS): ['new']"]


# ------------------------------------------------------------------ the real tree
@pytest.fixture(scope="module")
def real_graph():
    return build_graph(REPO)


def test_every_module_has_a_layer(real_graph):
    modules, _, _ = real_graph
    assert {layer_of(m) for m in modules} <= set(LAYERS), (
        f"place these in LAYERS: {sorted({layer_of(m) for m in modules} - set(LAYERS))}")
    assert {"jaxrl_llm.core", "jaxrl_llm.train", "launch.common", "experiments.demo"} <= set(modules)  # walk ok


def test_no_import_cycles(real_graph):
    modules, edges, _ = real_graph
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for edge in edges:
        if not edge.type_only:
            graph[edge.src].add(edge.dst)
    cycles = find_cycles(graph)
    assert not cycles, "\n" + cycle_report(cycles, edges)


def test_no_upward_imports(real_graph):
    _, edges, _ = real_graph
    bad = upward_imports(edges, LAYERS)
    assert not bad, "\n" + upward_report(bad, LAYERS)


def train_edges(edges: Iterable[Import]) -> list[Import]:
    """The edges between two modules of jaxrl_llm.train."""
    inside = lambda module: module == TRAIN or module.startswith(TRAIN + ".")  # noqa: E731
    return [e for e in edges if inside(e.src) and inside(e.dst)]


def test_train_rooms_on_hand_built_edges():
    def edge(src, dst, line):
        return Import(f"{TRAIN}.{src}", f"{TRAIN}.{dst}", f"{src}.py", line, f"import {dst}")
    edges = [edge("sample.stage", "learn.learner", 1), edge("config.schema", "plan", 2),
             edge("run.loop", "learn.step", 3), edge("learn.learner", "config.schema", 4),
             edge("sample.engines", "sample.weight_check", 5), edge("learn.step", "run.metrics", 6)]
    bad = upward_imports(edges, TRAIN_ROOMS, package=TRAIN)
    assert [e.line for e in bad] == [1, 2, 6]
    report = upward_report(bad, TRAIN_ROOMS, package=TRAIN)
    assert "upward import sample -> learn: sample.stage.py:1" in report
    assert "upward import config -> plan: config.schema.py:2" in report


def test_train_rooms(real_graph):
    modules, edges, _ = real_graph
    rooms = {layer_of(m, TRAIN) for m in modules if m == TRAIN or m.startswith(TRAIN + ".")}
    assert rooms == set(TRAIN_ROOMS), f"place these in TRAIN_ROOMS: {sorted(rooms - set(TRAIN_ROOMS))}"
    bad = upward_imports(train_edges(edges), TRAIN_ROOMS, package=TRAIN)
    assert not bad, "\n" + upward_report(bad, TRAIN_ROOMS, package=TRAIN)


def test_imported_modules_exist(real_graph):
    _, _, unresolved = real_graph
    assert not unresolved, "\n" + "\n".join(f"import of a missing module {e.dst}: {e.where()}" for e in unresolved)


# ------------------------------------------------------------- the benchmark rooms
# jaxrl_llm/benchmarks/{cpu,gpu,tpu,common}: nothing of the package outside them imports them except
# jaxrl_llm/cli.py, and the rooms import only `common` of each other.
BENCHMARKS = f"{PACKAGE}.benchmarks"
# room -> the rooms it may import; `common` holds what more than one room uses.
BENCHMARK_ROOMS: dict[str, set[str]] = {
    BENCHMARKS: set(),
    "common": set(),
    "cpu": {"common"},
    "gpu": {"common"},
    "tpu": {"common"},
}
MAY_IMPORT_BENCHMARKS = {f"{PACKAGE}.cli"}  # the one package module above the benchmarks


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def benchmark_importers(edges: list[Import]) -> list[Import]:
    """Edges from a package module outside the benchmarks (and not cli.py) into them."""
    return [e for e in edges if not e.via and _inside(e.dst, BENCHMARKS) and _inside(e.src, PACKAGE)
            and not _inside(e.src, BENCHMARKS) and e.src not in MAY_IMPORT_BENCHMARKS]


def room_edges(edges: list[Import]) -> list[Import]:
    return [e for e in edges if _inside(e.src, BENCHMARKS) and _inside(e.dst, BENCHMARKS)]


def test_only_cli_imports_the_benchmarks(real_graph):
    _, edges, _ = real_graph
    bad = benchmark_importers(edges)
    assert not bad, "package modules that import the benchmark rooms (only cli.py may):\n" + "\n".join(
        e.where() for e in bad)


def test_rooms_import_only_common(real_graph):
    modules, edges, _ = real_graph
    rooms = {layer_of(m, BENCHMARKS) for m in modules if _inside(m, BENCHMARKS)}
    assert rooms == set(BENCHMARK_ROOMS), f"place these in BENCHMARK_ROOMS: {sorted(rooms ^ set(BENCHMARK_ROOMS))}"
    flat = sorted(p.name for m, p in modules.items() if _inside(m, BENCHMARKS) and p.parent.name == "benchmarks"
                  and p.name != "__init__.py")
    assert not flat, f"benchmark modules outside a room (move each into one): {flat}"
    bad = upward_imports(room_edges(edges), BENCHMARK_ROOMS, package=BENCHMARKS)
    assert not bad, "\n" + upward_report(bad, BENCHMARK_ROOMS, package=BENCHMARKS)


def test_benchmark_rooms_on_a_planted_tree(tmp_path: Path):
    """A model module and a gpu module that break the two rules are both named; cli.py is allowed."""
    files = {
        "jaxrl_llm/__init__.py": "", "jaxrl_llm/cli.py": "from jaxrl_llm.benchmarks.gpu import check\n",
        "jaxrl_llm/models/__init__.py": "",
        "jaxrl_llm/models/decoder.py": "def f():\n    from jaxrl_llm.benchmarks.common.timing import log\n",
        "jaxrl_llm/benchmarks/__init__.py": "", "jaxrl_llm/benchmarks/common/__init__.py": "",
        "jaxrl_llm/benchmarks/common/timing.py": "", "jaxrl_llm/benchmarks/gpu/__init__.py": "",
        "jaxrl_llm/benchmarks/gpu/check.py": "from jaxrl_llm.benchmarks.common import timing\n",
        "jaxrl_llm/benchmarks/cpu/__init__.py": "",
        "jaxrl_llm/benchmarks/cpu/model.py": "from jaxrl_llm.benchmarks.gpu.check import x\n",
    }
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    _, edges, _ = build_graph(tmp_path, apps=())
    assert sorted({(e.path, e.line) for e in benchmark_importers(edges)}) == [("jaxrl_llm/models/decoder.py", 2)]
    bad = upward_imports(room_edges(edges), BENCHMARK_ROOMS, package=BENCHMARKS)
    assert sorted({(e.path, e.line) for e in bad}) == [("jaxrl_llm/benchmarks/cpu/model.py", 1)]
    assert "upward import cpu -> gpu" in upward_report(bad, BENCHMARK_ROOMS, package=BENCHMARKS)
