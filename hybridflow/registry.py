"""One registry convention for every kind of thing users add (algorithms, rollout engines, model families,
and the tools to come): `register_<kind>(record)` files the record under the name it carries, and a lookup
of an unknown name raises one `UserError` line naming the config field and every known name.

torchtitan's train-spec registry is the model. This module is a leaf (it imports only hybridflow.errors), so
records and their registries sit below config and placement.
"""

from __future__ import annotations

from collections.abc import Iterable

from hybridflow.errors import UserError


class Registry[R]:
    """Records of one kind by name, in registration order.

    `field` is the config field the name comes from (it starts the lookup error); `reserved` are names no
    record may take (e.g. rollout.engine's `auto`)."""

    def __init__(self, kind: str, field: str, reserved: Iterable[str] = ()) -> None:
        self.kind, self.field, self.reserved = kind, field, tuple(reserved)
        self._records: dict[str, R] = {}

    def add(self, name: str, record: R) -> R:
        """File `record` under `name`; a name is registered once (again with an equal record is a no-op: a
        user module imported a second time, as a notebook re-runs a cell, re-registers the same record)."""
        if name in self.reserved or self._records.get(name, record) != record:
            raise ValueError(f"register_{self.kind}: {name!r} is registered already (or reserved); "
                             "give the new record another name")
        self._records[name] = record
        return record

    def get(self, name: str) -> R:
        """The record filed under `name`; one UserError line listing the known names otherwise."""
        try:
            return self._records[name]
        except KeyError:
            known = ", ".join((*self._records, *self.reserved))
            raise UserError(f"{self.field}: {name!r} is unknown; use one of {known}") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._records)

    def records(self) -> tuple[R, ...]:
        """The registered records, in registration order."""
        return tuple(self._records.values())

    def __contains__(self, name: object) -> bool:
        return name in self._records
