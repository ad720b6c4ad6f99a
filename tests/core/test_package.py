"""Package rules: core imports only jax / chex / numpy (and the standard library), every
public name is documented."""
import ast
import inspect
import pathlib
import sys

from jaxrl_llm import core

CORE_DIR = pathlib.Path(core.__file__).parent
ALLOWED_THIRD_PARTY = {"jax", "chex", "numpy"}


def _imported_modules(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            yield node.module


def test_core_imports_only_jax_chex_numpy_and_itself():
    files = sorted(CORE_DIR.glob("*.py"))
    assert {f.stem for f in files} >= {"advantages", "losses", "aggregation", "kl", "corrections", "filters",
                                       "diversity", "bias", "evaluation", "recipes"}
    for path in files:
        for module in _imported_modules(path):
            top = module.split(".")[0]
            allowed = (top in ALLOWED_THIRD_PARTY or top in sys.stdlib_module_names
                       or module == "jaxrl_llm.core" or module.startswith("jaxrl_llm.core."))
            assert allowed, f"{path.name} imports {module}"
            assert top not in {"io", "os", "pathlib", "shutil", "socket", "subprocess"}, f"{path.name}: I/O"


def test_every_public_function_has_a_docstring():
    public = [getattr(core, name) for name in dir(core) if not name.startswith("_")]
    functions = [obj for obj in public if inspect.isfunction(obj) or inspect.isclass(obj)]
    assert len(functions) > 40
    undocumented = [f.__name__ for f in functions
                    if not (f.__doc__ or "").strip() and not issubclass_namedtuple(f)]
    assert undocumented == []


def issubclass_namedtuple(obj):
    return inspect.isclass(obj) and issubclass(obj, tuple) and hasattr(obj, "_fields")
