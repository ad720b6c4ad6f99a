"""A typed config (`typed_config.Section`) to and from files: a Python experiment file with
`get_config()` (big_vision style, optionally `file.py:ARG`), or JSON; saved atomically.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
import types
from pathlib import Path
from typing import Any, Sequence

from jaxrl_llm.utils.atomic_files import write_text_atomic
from jaxrl_llm.utils.typed_config import ConfigError, Section, apply_overrides, from_dict


def import_file(path: Path) -> types.ModuleType:
    """Runs a Python config file as a module of its own, with its folder on sys.path meanwhile;
    a syntax error becomes a ConfigError naming the file and line."""
    name = f"_jaxrl_experiment_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"cannot import config file {str(path)!r}; valid: a .py file with get_config()")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses defined in the file need their module
    folder = str(path.resolve().parent)
    sys.path.insert(0, folder)  # sibling modules (e.g. experiments/base_configs.py)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        raise ConfigError(f"{path}:{err.lineno}: syntax error in the config file: {err.msg}") from None
    finally:
        sys.modules.pop(name, None)
        if folder in sys.path:
            sys.path.remove(folder)
    return module


def load(cls: type, path: str | os.PathLike, overrides: Sequence[str] = ()) -> Any:
    """Loads a `cls` config: `path` is a .py file with get_config() or a .json file.

    A .py path may end in ":ARG" (big_vision style); ARG is passed to
    get_config(ARG). get_config may return a `cls` or a nested dict of the
    fields it changes. Overrides are then applied in order. The file may
    import modules that sit next to it (its folder is on sys.path while it runs).
    """
    text = os.fspath(path)
    arg = None
    if ".py:" in text:
        text, arg = text.split(".py:", 1)
        text += ".py"
    file = Path(text)
    if not file.is_file():
        raise ConfigError(f"config file {text!r} does not exist; valid: a path to an experiments/*.py file "
                          "or a config.json")
    if file.suffix == ".json":
        if arg is not None:
            raise ConfigError(f"a JSON config takes no ':ARG' (got {arg!r})")
        cfg = load_json(cls, file)
    else:
        module = import_file(file)
        get_config = getattr(module, "get_config", None)
        if not callable(get_config):
            raise ConfigError(f"{text} has no get_config() function; an experiment file must define one")
        raw = get_config() if arg is None else get_config(arg)
        cfg = from_dict(cls, raw)
    return apply_overrides(cfg, overrides)


def save(cfg: Section, path: str | os.PathLike) -> None:
    """Writes cfg as JSON atomically (temporary file + rename)."""
    write_text_atomic(Path(path), json.dumps(cfg.to_dict(), indent=2) + "\n")


def load_json(cls: type, path: str | os.PathLike) -> Any:
    try:
        data = json.loads(Path(path).read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{os.fspath(path)} is not valid JSON: {err}") from None
    return from_dict(cls, data)
