"""A small typed-configuration library: frozen dataclass sections with validated fields.

    @dataclasses.dataclass(frozen=True)
    class Optim(Section):
        lr: float = field(1e-6, gt=0.0)
        schedule: Literal["constant", "cosine"] = "constant"
        _path_prefix = "optim."

Every way in (constructor, dict/JSON, a command-line string such as
`optim.lr=1e-5`) goes through the same checks, so a bad value fails at
start-up with a message that names the field, the value and what would be
valid, and an unknown key lists the valid keys and the closest match.

Supported field types: bool, int, float, str, Literal[...] of strings,
tuple[X, ...] of those scalars, `X | None`, nested sections, and
`dict[str, Any]`: a JSON object (read-only; on the command line as JSON,
`task.kwargs='{"dataset": "maze"}'`), for keyword arguments handed on to user code.

Why not ml_collections (big_vision's choice): its ConfigDict checks types
only against the value first assigned, has no ranges or allowed values, no
`X | None` fields and no "did you mean" for unknown keys; a frozen dataclass
tree gives all of that plus attribute completion in an editor, with no dependency.
Config files: `utils.config_files`. The schema of jaxrl_llm's runs: train/config/schema.py.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
import math
import types
import typing
from typing import Any, Literal, Mapping, Sequence

class ConfigError(ValueError):
    """A configuration key or value is invalid; the message says what is valid."""


class JsonDict(dict):
    """The value of a `dict[str, Any]` field: a JSON object that cannot be changed in place
    (config sections are frozen) and hashes by its JSON text."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(json.dumps(self, sort_keys=True))

    def __reduce__(self):  # pickle and deepcopy rebuild it whole (item by item would be refused)
        return (JsonDict, (dict(self),))

    def _read_only(self, *args, **kwargs):
        raise TypeError("a config value is read-only; build a new config with replace_values")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only


def field(default: Any, *, ge=None, gt=None, le=None, lt=None, choices=None) -> Any:
    """A dataclass field with an optional numeric range or a set of allowed values, e.g.
    `lr: float = field(1e-6, gt=0.0)`."""
    bounds = {k: v for k, v in dict(ge=ge, gt=gt, le=le, lt=lt, choices=choices).items() if v is not None}
    if isinstance(default, (dict, list)) and not isinstance(default, JsonDict):
        raise TypeError("mutable defaults are not allowed in config sections")
    return dataclasses.field(default=default, metadata=bounds)


def section(cls: type) -> Any:
    """A nested section field: `train: TrainConfig = section(TrainConfig)`."""
    return dataclasses.field(default_factory=cls)


class Section:
    """Base of every config section: validates and normalises fields on construction."""

    def __post_init__(self) -> None:
        prefix = getattr(self, "_path_prefix", "")
        for f in dataclasses.fields(self):
            tp = _field_types(type(self))[f.name]
            path = f"{prefix}{f.name}"
            value = _coerce(getattr(self, f.name), tp, path)
            _check_bounds(value, f.metadata, path)
            object.__setattr__(self, f.name, value)
        self._check_consistency()

    def _check_consistency(self) -> None:
        """Cross-field checks; sections override this."""

    def to_dict(self) -> dict[str, Any]:
        """Nested plain dict (tuples become lists) that `from_dict` accepts."""
        return {f.name: _to_plain(getattr(self, f.name)) for f in dataclasses.fields(self)}


# ------------------------------ types: coercion of Python values and parsing of command-line strings

_SCALARS = (bool, int, float, str)


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and issubclass(tp, Section)


def _optional_inner(tp: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == len(typing.get_args(tp)) - 1 and len(args) == 1:
            return args[0]
    return None


def _describe(tp: Any) -> str:
    inner = _optional_inner(tp)
    if inner is not None:
        return f"{_describe(inner)} or None"
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if typing.get_origin(tp) is tuple:
        elem = typing.get_args(tp)[0]
        plural = {bool: "bools", int: "ints", float: "floats", str: "strings"}
        return f"a tuple of {plural.get(elem) or _describe(elem)}"
    if _is_section(tp):
        return f"a section ({tp.__name__})"
    if _is_json_dict(tp):
        return 'a JSON object such as {"key": 1}'
    return {bool: "a bool", int: "an int", float: "a float", str: "a string"}.get(tp, str(tp))


def _is_json_dict(tp: Any) -> bool:
    return typing.get_origin(tp) is dict and typing.get_args(tp)[:1] == (str,)


def _coerce_json_dict(value: Any, tp: Any, path: str) -> JsonDict:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise _type_error(path, value, tp)
    try:  # a JSON round trip: the value must survive config.json unchanged
        plain = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{path} = {value!r} is not JSON-serialisable ({err}); valid: {_describe(tp)} "
                          "of strings, numbers, bools, null, lists and objects") from None
    return JsonDict(plain)


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Checks a Python value against a field type; returns the normalised value."""
    inner = _optional_inner(tp)
    if inner is not None:
        return None if value is None else _coerce(value, inner, path)
    if _is_json_dict(tp):
        return _coerce_json_dict(value, tp, path)
    origin = typing.get_origin(tp)
    if origin is Literal:
        if isinstance(value, str) and value in typing.get_args(tp):
            return value
        raise _type_error(path, value, tp)
    if origin is tuple:
        if not isinstance(value, (tuple, list)):
            raise _type_error(path, value, tp)
        elem = typing.get_args(tp)[0]
        return tuple(_coerce(v, elem, f"{path}[{i}]") for i, v in enumerate(value))
    if _is_section(tp):
        if isinstance(value, tp):
            return value
        if isinstance(value, Mapping):
            return _section_from_dict(tp, value, path + ".")
        raise _type_error(path, value, tp)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if _is_integral(value):  # numpy ints, from numerical code
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if _is_real(value):
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    else:
        raise TypeError(f"unsupported config field type {tp!r} at {path}")
    raise _type_error(path, value, tp)


def _is_integral(value: Any) -> bool:
    return hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iu"


def _is_real(value: Any) -> bool:
    return hasattr(value, "dtype") and getattr(value, "shape", None) == () and value.dtype.kind in "iuf"


def _type_error(path: str, value: Any, tp: Any) -> ConfigError:
    hint = ""
    if typing.get_origin(tp) is Literal and isinstance(value, str):
        hint = did_you_mean(value, typing.get_args(tp))
    return ConfigError(f"{path} = {value!r} ({type(value).__name__}) is invalid; valid: {_describe(tp)}{hint}")


def _check_bounds(value: Any, bounds: Mapping[str, Any], path: str) -> None:
    if value is None or not bounds:
        return
    if "choices" in bounds and value not in bounds["choices"]:
        hint = did_you_mean(str(value), [str(c) for c in bounds["choices"]])
        raise ConfigError(
            f"{path} = {value!r} is invalid; valid: one of {', '.join(map(repr, bounds['choices']))}{hint}"
        )
    if isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{path} = nan is invalid; valid: a number")
    checks = {
        "ge": (lambda v, b: v >= b, ">="),
        "gt": (lambda v, b: v > b, ">"),
        "le": (lambda v, b: v <= b, "<="),
        "lt": (lambda v, b: v < b, "<"),
    }
    failed = [name for name, (ok, _) in checks.items() if name in bounds and not ok(value, bounds[name])]
    if failed:
        valid = " and ".join(f"{checks[n][1]} {bounds[n]!r}" for n in checks if n in bounds)
        raise ConfigError(f"{path} = {value!r} is out of range; valid: {valid}")


def did_you_mean(word: str, options: Sequence[str]) -> str:
    """"; did you mean 'x'?" for the option closest to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


_TRUE, _FALSE, _NONE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}, {"none", "null"}


def parse_value(text: str, tp: Any, path: str) -> Any:
    """Parses a command-line string into a value of field type `tp`.

    bool: true/false/yes/no/on/off/1/0. None: "none" or "null" where the
    field allows None. Tuples: comma-separated, optionally in [] or ();
    "()" or "[]" is empty. Quotes around a string are removed, so '"none"'
    is the string "none".
    """
    text = text.strip()
    inner = _optional_inner(tp)
    if inner is not None:
        if text.lower() in _NONE:
            return None
        return parse_value(text, inner, path)
    origin = typing.get_origin(tp)
    if origin is tuple:
        body = text[1:-1] if text[:1] + text[-1:] in ("[]", "()") else text
        items = [s for s in (p.strip() for p in body.split(",")) if s]
        elem = typing.get_args(tp)[0]
        return tuple(parse_value(s, elem, f"{path}[{i}]") for i, s in enumerate(items))
    if _is_section(tp):
        valid = ", ".join(f.name for f in dataclasses.fields(tp))
        raise ConfigError(f"{path} is a section, not a value; set one of its fields ({valid}), e.g. {path}.<field>=...")
    if origin is Literal or tp is str:
        return _unquote(text)
    if _is_json_dict(tp):
        try:
            value = json.loads(_unquote(text) if text[:1] in "'\"" else text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"{path} = {text!r} is not valid JSON ({err.msg} at column {err.colno}); "
                              f'valid: a JSON object such as {path}=\'{{"key": 1}}\'') from None
        if not isinstance(value, dict):
            raise ConfigError(f"{path} = {text!r} is not a JSON object; valid: a JSON object such as "
                              f'{path}=\'{{"key": 1}}\'')
        return value
    if tp is bool:
        if text.lower() in _TRUE | _FALSE:
            return text.lower() in _TRUE
        raise ConfigError(f"{path} = {text!r} is not a bool; valid: true/false (also yes/no, on/off, 1/0)")
    if tp is int:
        try:
            return int(text.replace("_", ""), 0) if text.lower().startswith(("0x", "0b", "0o")) else int(text)
        except ValueError:
            raise ConfigError(f"{path} = {text!r} is not an int; valid: an integer such as 8") from None
    if tp is float:
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{path} = {text!r} is not a float; valid: a number such as 1e-5 or 0.5") from None
    raise TypeError(f"unsupported config field type {tp!r} at {path}")


def schema_help(cls: type, prefix: str = "") -> str:
    """One line per field: `train.lr: float = 1e-06 (> 0.0)`, for `--help` style listings."""
    lines = []
    for f in dataclasses.fields(cls):
        tp = _field_types(cls)[f.name]
        if _is_section(tp):
            lines.append(schema_help(tp, f"{prefix}{f.name}."))
            continue
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
        bounds = [f"{symbols[k]} {v!r}" for k, v in f.metadata.items() if k in symbols]
        if "choices" in f.metadata:
            bounds.append("one of " + ", ".join(map(repr, f.metadata["choices"])))
        note = f" ({' and '.join(bounds)})" if bounds else ""
        lines.append(f"{prefix}{f.name}: {_describe(tp)} = {default!r}{note}")
    return "\n".join(lines)


def _unquote(text: str) -> str:
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"" else text


def _to_plain(value: Any) -> Any:
    if isinstance(value, Section):
        return value.to_dict()
    if isinstance(value, tuple):
        return [_to_plain(v) for v in value]
    if isinstance(value, JsonDict):
        return json.loads(json.dumps(value))
    return value


# ------------------------------------------------ building configs: dicts, dotted overrides, JSON


def _unknown_key_error(cls: type, key: str, prefix: str) -> ConfigError:
    valid = [f.name for f in dataclasses.fields(cls)]
    where = f"'{prefix[:-1]}'" if prefix else "the top level"
    return ConfigError(
        f"unknown config key {prefix + key!r}; valid keys at {where}: {', '.join(valid)}"
        f"{did_you_mean(key, valid)}"
    )


def _section_from_dict(cls: type, data: Mapping[str, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if key not in names:
            raise _unknown_key_error(cls, str(key), prefix)
    return cls(**data)


def from_dict(cls: type, data: Mapping[str, Any]) -> Any:
    """Builds a validated `cls` (a Section) from a (possibly partial) nested dict.

    Missing fields take their defaults, so an experiment may list only what
    it changes. Lists are accepted for tuple fields (JSON has no tuples).
    """
    if isinstance(data, cls):
        return data
    if not isinstance(data, Mapping):
        raise ConfigError(f"a config must be a {cls.__name__} or a dict, got {type(data).__name__}")
    return _section_from_dict(cls, data, "")


def _resolve(cfg: Section, dotted: str) -> tuple[type, list[str], Any]:
    """Returns (section class holding the field, path parts, field type)."""
    parts = dotted.split(".")
    cls: type = type(cfg)
    for depth, part in enumerate(parts):
        names = {f.name for f in dataclasses.fields(cls)}
        if part not in names:
            raise _unknown_key_error(cls, part, "".join(p + "." for p in parts[:depth]))
        tp = _field_types(cls)[part]
        if depth < len(parts) - 1:
            if not _is_section(tp):
                raise ConfigError(f"{'.'.join(parts[: depth + 1])} is {_describe(tp)}, not a section")
            cls = tp
    return cls, parts, tp


def replace_values(cfg: Section, values: Mapping[str, Any]) -> Section:
    """Returns cfg with dotted keys set to Python values, e.g. {"train.lr": 1e-5}.

    Cross-field checks run once, after all values are set.
    """
    plain = cfg.to_dict()
    for dotted, value in values.items():
        _, parts, _ = _resolve(cfg, dotted)
        node = plain
        for p in parts[:-1]:
            node = node[p]
        node[parts[-1]] = _to_plain(value) if isinstance(value, (Section, tuple, JsonDict)) else value
    return from_dict(type(cfg), plain)


def parse_overrides(cfg: Section, overrides: Sequence[str]) -> dict[str, Any]:
    """Parses ["train.lr=1e-5", ...] into {"train.lr": 1e-05, ...} using the schema types."""
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form section.field=value (e.g. train.lr=1e-5)")
        _, _, tp = _resolve(cfg, key)
        parsed[key] = parse_value(text, tp, key)
    return parsed


def apply_overrides(cfg: Section, overrides: Sequence[str]) -> Section:
    """Applies command-line overrides ("train.lr=1e-5") to cfg; later ones win."""
    return replace_values(cfg, parse_overrides(cfg, overrides))
