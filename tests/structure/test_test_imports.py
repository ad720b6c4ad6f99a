"""No module under tests/ imports a test module (a file named test_*.py).

Shared fixtures live in conftest.py files (pytest finds them by folder), shared functions and
constants in plain helper modules (tests/train/tiny_run.py, tests/train/learning_setup.py,
tests/core/batches.py, ...). A test module that imports another one runs the other's
module-level code, re-registers its fixtures under a second module and ties the two files'
edits together; with pytest-xdist it also makes one worker collect tests it never runs.

Every .py file under tests/ is parsed with `ast` (nothing is imported). Each import, at module
level or inside a function, names modules:

  import a.b.c                    -> a.b.c
  from a.b import c               -> a.b and, when a/b/c.py exists, a.b.c
  from . import c / from .c import x   resolved against the importing file's package

An import is refused when it names a module whose file is tests/**/test_*.py.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, NamedTuple

REPO = Path(__file__).resolve().parents[2]


class TestImport(NamedTuple):
    importer: str  # path relative to the repository root
    line: int
    module: str  # the dotted name of the imported test module


def module_name(path: Path, root: Path) -> str:
    """tests/train/test_loop.py -> tests.train.test_loop (relative to `root`)."""
    return ".".join(path.relative_to(root).with_suffix("").parts)


def module_file(name: str, root: Path) -> Path | None:
    """The file a dotted module name resolves to under `root` (module.py or package/__init__.py)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_modules(tree: ast.AST, importer: str) -> Iterator[tuple[int, str]]:
    """(line, dotted module name) for every module an import in `tree` may load; `importer` is
    the importing module's dotted name (for relative imports)."""
    package = importer.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[:len(parts) - node.level + 1])
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            yield node.lineno, source
            for alias in node.names:
                yield node.lineno, f"{source}.{alias.name}"


def is_test_module(path: Path) -> bool:
    return path.name.startswith("test_") and path.suffix == ".py"


def test_module_imports(root: Path, tests_dir: str = "tests") -> list[TestImport]:
    """Every import, in any .py file under root/tests_dir, of a test_*.py module there."""
    found = []
    for path in sorted((root / tests_dir).rglob("*.py")):
        importer = module_name(path, root)
        for line, name in imported_modules(ast.parse(path.read_text(), str(path)), importer):
            target = module_file(name, root)
            if target is not None and target != path and is_test_module(target):
                found.append(TestImport(str(path.relative_to(root)), line, name))
    return found


test_module_imports.__test__ = False  # a helper, not a test (its name starts with "test_")
TestImport.__test__ = False


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_finds_each_form_of_import_of_a_test_module_and_nothing_else(tmp_path):
    for package in ("tests", "tests/a", "tests/b"):
        write(tmp_path, f"{package}/__init__.py", "")
    write(tmp_path, "tests/a/test_x.py", "X = 1\n")
    write(tmp_path, "tests/a/helpers.py", "H = 1\n")
    write(tmp_path, "tests/a/conftest.py", "from tests.a.helpers import H\n")  # a helper: allowed
    write(tmp_path, "tests/b/test_absolute.py", "import os\nfrom tests.a.test_x import X\n")
    write(tmp_path, "tests/b/test_package_form.py", "from tests.a import helpers, test_x\n")
    write(tmp_path, "tests/b/test_plain.py", "import tests.a.test_x as tx\n")
    write(tmp_path, "tests/a/test_relative.py", "def f():\n    from .test_x import X\n    return X\n")
    write(tmp_path, "tests/a/mixed_helper.py", "from . import test_x\n")  # helpers may not either
    assert test_module_imports(tmp_path) == [
        TestImport("tests/a/mixed_helper.py", 1, "tests.a.test_x"),
        TestImport("tests/a/test_relative.py", 2, "tests.a.test_x"),
        TestImport("tests/b/test_absolute.py", 2, "tests.a.test_x"),
        TestImport("tests/b/test_package_form.py", 1, "tests.a.test_x"),
        TestImport("tests/b/test_plain.py", 1, "tests.a.test_x"),
    ]


def test_no_module_under_tests_imports_a_test_module():
    found = test_module_imports(REPO)
    assert not found, ("test modules imported by other modules (move the shared fixture to a "
                       "conftest.py, the shared function to a helper module not named test_*.py): "
                       + "; ".join(f"{f.importer}:{f.line} imports {f.module}" for f in found))
