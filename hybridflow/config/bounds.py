"""Valid ranges declared on the config dataclasses, checked in one walk when the config is loaded.

A field declares its range where it is defined:

    cliprange: float = bounded(0.2, gt=0, le=1)
    seed_mode: str = bounded("per_batch", choices=SEED_MODES)
    architecture: str = bounded("LlamaForCausalLM", choices=supported_architectures)  # a registry, read late

`check_bounds(cfg)` walks the whole dataclass tree and raises one `UserError` line for the first value out of
range: `<dotted.field>: <value> <problem>; use <what is allowed>`. `None` is accepted for optional fields (it
means "derive it"). Cross-field rules (a batch dividing another, TP dividing heads) stay with their owners.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from hybridflow.errors import UserError

BOUND_KEY = "bound"


@dataclass(frozen=True)
class Bound:
    """An interval (any side open, closed or absent) or a set of allowed values."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    # A tuple, or a function returning one (a registry's names, read when checked, so entries registered
    # after the config classes were defined count).
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None

    def allowed(self) -> tuple[Any, ...] | None:
        """The allowed values now (None: an interval, not a set)."""
        return self.choices() if callable(self.choices) else self.choices

    def describe(self) -> str:
        """The allowed values in words, e.g. 'a value in (0, 1]' or 'one of fixed, adaptive'."""
        if self.choices is not None:
            return "one of " + ", ".join(str(c) for c in self.allowed())
        low = f"[{_num(self.ge)}" if self.ge is not None else f"({_num(self.gt)}" if self.gt is not None else None
        high = f"{_num(self.le)}]" if self.le is not None else f"{_num(self.lt)})" if self.lt is not None else None
        if low and high:
            return f"a value in {low}, {high}"
        if low:
            return f"a value {'>=' if self.ge is not None else '>'} {_num(self.ge if self.ge is not None else self.gt)}"
        return f"a value {'<=' if self.le is not None else '<'} {_num(self.le if self.le is not None else self.lt)}"

    def problem(self, value: Any) -> str | None:
        """Why `value` is out of range, or None when it is allowed."""
        if self.choices is not None:
            return None if value in self.allowed() else "is unknown"
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"is a {type(value).__name__}, not a number"
        if isinstance(value, float) and math.isnan(value):
            return "is not a number"
        if isinstance(value, float) and math.isinf(value):  # no field takes inf for "no limit": None means unset
            return "is not finite"
        checks = (
            (self.ge, lambda b: value >= b, "is below"),
            (self.gt, lambda b: value > b, "is not above"),
            (self.le, lambda b: value <= b, "is above"),
            (self.lt, lambda b: value < b, "is not below"),
        )
        for bound, ok, words in checks:
            if bound is not None and not ok(bound):
                return f"{words} {_num(bound)}"
        return None


def _num(x: float | None) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def bounded(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Any = dataclasses.MISSING,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    choices: tuple[Any, ...] | Callable[[], tuple[Any, ...]] | None = None,
) -> Any:
    """A dataclass field with a declared valid range (see the module docstring)."""
    if choices is not None and not callable(choices):
        choices = tuple(choices)
    bound = Bound(ge=ge, gt=gt, le=le, lt=lt, choices=choices)
    return dataclasses.field(default=default, default_factory=default_factory, metadata={BOUND_KEY: bound})


def field_bound(f: dataclasses.Field) -> Bound | None:
    """The range a dataclass field declares, if any."""
    return f.metadata.get(BOUND_KEY)


def walk_fields(obj: Any, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """(dotted name, field, value) for every field of a dataclass tree, depth first in declaration order."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}{f.name}"
        yield name, f, value
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            yield from walk_fields(value, f"{name}.")


def check_bounds(cfg: Any, prefix: str = "") -> None:
    """Raise `UserError` for the first field whose value is outside its declared range."""
    for name, f, value in walk_fields(cfg, prefix):
        bound = field_bound(f)
        if bound is None or value is None:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        for item in values:
            problem = bound.problem(item)
            if problem is not None:
                raise UserError(f"{name}: {item!r} {problem}; use {bound.describe()}")
