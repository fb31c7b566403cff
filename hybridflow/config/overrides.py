"""A typed config changed in Python, written back as Hydra overrides: what the ranks (new processes) compose
to get the same config, and what a command line would say to reproduce it."""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from typing import Any

from hybridflow.errors import UserError

ABSENT: Any = object()  # a map's key that one side lacks


def changed_fields(base: Any, changed: Any, prefix: str = "") -> list[tuple[str, Any, Any]]:
    """`(key, old, new)` for each leaf where dataclass `changed` differs from `base` (a tuple equals the list
    it composes to); maps compare key by key, `old` or `new` ABSENT where a key was added or removed. An
    attribute that is no field (a typo) and a value of the wrong type raise UserError naming the field."""
    names = [f.name for f in dataclasses.fields(changed)]
    for name in getattr(changed, "__dict__", {}).keys() - set(names):  # setattr takes any name, a typo too
        close = difflib.get_close_matches(name, names, n=1)
        known = f"{prefix.rstrip('.') or 'the top level'} takes {', '.join(names)}"
        raise UserError(f"{prefix}{name}: unknown field; " + (f"did you mean {prefix}{close[0]}?" if close else known))
    hints = typing.get_type_hints(type(changed))
    found = []
    for name in names:
        old, new, key = getattr(base, name), getattr(changed, name), f"{prefix}{name}"
        if dataclasses.is_dataclass(old) and type(old) is type(new):
            found += changed_fields(old, new, f"{key}.")
        elif isinstance(old, dict) and isinstance(new, dict):
            found += _changed_keys(old, new, key)
        elif plain(old) != plain(new):
            if not _fits(new, hints[name]):
                raise UserError(f"{key}: {new!r} is a {type(new).__name__}; the field takes "
                                f"{_type_name(hints[name])}")
            found.append((key, old, new))
    return found


def _changed_keys(old: dict, new: dict, prefix: str) -> list[tuple[str, Any, Any]]:
    found = []
    for k in [*old, *(k for k in new if k not in old)]:
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_]\w*", k):
            raise UserError(f"{prefix}: key {k!r} has no form in a Hydra override; use letters, digits and _")
        a, b = old.get(k, ABSENT), new.get(k, ABSENT)
        if isinstance(a, dict) and isinstance(b, dict):
            found += _changed_keys(a, b, f"{prefix}.{k}")
        elif plain(a) != plain(b):
            found.append((f"{prefix}.{k}", a, b))
    return found


def override(key: str, old: Any, new: Any) -> str:
    """The Hydra override that turns `old` at `key` into `new`: a map's new key is added (`+`), a removed
    one deleted (`~`)."""
    if new is ABSENT:
        return f"~{key}"
    return f"{'+' if old is ABSENT else ''}{key}={hydra_value(new)}"


def value_at(config: Any, key: str) -> Any:
    """The value at dotted `key` of dataclass `config` (ABSENT for a map's missing key)."""
    for part in key.split("."):
        config = config.get(part, ABSENT) if isinstance(config, dict) else getattr(config, part)
    return config


def plain(value: Any) -> Any:
    """`value` with tuples as lists (what composing makes of them), for comparing."""
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def _options(hint: Any) -> tuple[Any, ...]:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    return tuple(typing.get_origin(t) or t for t in (typing.get_args(hint) if union else (hint,)))


def _fits(value: Any, hint: Any) -> bool:
    """Whether `value` has a type field `hint` declares (an int for a float, a tuple for a list); hints beyond
    plain classes are left to composing."""
    kinds = set(_options(hint))
    if not all(isinstance(k, type) for k in kinds):  # Any, Literal, ...
        return True
    kinds |= {int} if float in kinds else set()
    kinds |= {tuple} if list in kinds else set()
    return isinstance(value, tuple(kinds)) and (bool in kinds or not isinstance(value, bool))


def _type_name(hint: Any) -> str:
    return " or ".join("null" if k is type(None) else getattr(k, "__name__", str(k)) for k in _options(hint))


def hydra_value(value: Any) -> str:
    """`value` in Hydra's override grammar: strings quoted (so `,`, `:` and spaces stay text), containers
    element by element."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        # Escapes: the quote and backslash of the grammar, and `${` (an interpolation otherwise).
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'").replace("${", "\\${") + "'"
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"{value!r}: a {type(value).__name__} has no form in a Hydra override")
