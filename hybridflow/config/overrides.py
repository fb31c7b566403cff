"""A typed config changed in Python, written back as Hydra overrides: what the ranks (new processes) compose
to get the same config, and what a command line would say to reproduce it."""

from __future__ import annotations

import dataclasses
from typing import Any


def changed_overrides(base: Any, changed: Any, prefix: str = "") -> list[str]:
    """`key=value` overrides that turn dataclass `base` into `changed`, one per differing leaf."""
    overrides = []
    for f in dataclasses.fields(base):
        old, new = getattr(base, f.name), getattr(changed, f.name)
        key = f"{prefix}{f.name}"
        if old == new:
            continue
        if dataclasses.is_dataclass(old) and type(old) is type(new):
            overrides += changed_overrides(old, new, f"{key}.")
        else:
            overrides.append(f"{key}={hydra_value(new)}")
    return overrides


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
