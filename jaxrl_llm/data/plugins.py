"""User code named in a config: ``"package.module:attribute"`` strings.

A researcher brings a reward function, a task or an environment without editing the
library by naming it in the config (``task.reward_fn="my_pkg.rewards:score"``). This
module turns such a name into the object, with errors that say what was wrong.
Only importable names are accepted: the string is never evaluated as code.
"""
from __future__ import annotations

import importlib
import re
from typing import Any

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


class PluginError(ValueError):
    """A ``module:attribute`` name that cannot be loaded."""


def load_object(spec: str, *, what: str = "object") -> Any:
    """Import ``"package.module:attribute"`` (attribute may be dotted: ``"m:Class.method"``).

    ``what`` names the role in errors ("task.reward_fn", ...). The module is imported the
    normal way, so it must be on ``sys.path`` (an installed package, the working
    directory, or ``PYTHONPATH``).
    """
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise PluginError(f"{what} = {spec!r} is invalid; expected 'package.module:attribute', "
                          f"e.g. 'my_rewards:exact_match'")
    module_name, _, attribute = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise PluginError(f"{what} = {spec!r}: cannot import module {module_name!r} ({err}); "
                          f"is it on sys.path (working directory or PYTHONPATH)?") from err
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PluginError(f"{what} = {spec!r}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target
