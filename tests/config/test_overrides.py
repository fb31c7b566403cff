"""A config changed in Python as Hydra overrides (hybridflow.config.overrides): one override per changed leaf,
map keys added with `+` and removed with `~`, and a typo or a wrong type is one line naming the field."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from hybridflow.config.overrides import changed_fields, override
from hybridflow.errors import UserError


@dataclass
class Inner:
    steps: int = 1
    lr: float | None = None


@dataclass
class Outer:
    inner: Inner = field(default_factory=Inner)
    ids: list[int] = field(default_factory=list)
    args: dict[str, Any] = field(default_factory=lambda: {"a": 1, "b": {"c": 2}})


def overrides(changed: Outer) -> list[str]:
    return [override(*change) for change in changed_fields(Outer(), changed)]


def test_one_override_per_changed_leaf_and_map_keys_added_and_removed():
    assert overrides(Outer(ids=(), inner=Inner(lr=1))) == ["inner.lr=1"]  # a tuple is the list it composes to
    assert overrides(Outer(args={"b": {"c": 3}, "d": "x"})) == ["~args.a", "args.b.c=3", "+args.d='x'"]


@pytest.mark.parametrize("change, message", [
    (lambda o: setattr(o.inner, "stepz", 2), r"^inner.stepz: unknown field; did you mean inner.steps\?$"),
    (lambda o: setattr(o, "xyz", 2), r"^xyz: unknown field; the top level takes inner, ids, args$"),
    (lambda o: setattr(o.inner, "steps", 2.5), r"^inner.steps: 2.5 is a float; the field takes int$"),
    (lambda o: setattr(o.inner, "lr", "0.1"), r"^inner.lr: '0.1' is a str; the field takes float or null$"),
    (lambda o: o.args.update({"a.b": 1}), r"^args: key 'a.b' has no form in a Hydra override"),
])
def test_a_typo_a_wrong_type_or_a_bad_map_key_names_the_field(change, message):
    changed = Outer()
    change(changed)
    with pytest.raises(UserError, match=message):
        overrides(changed)
