"""Where roles run: explicit GPU lists per role, or `auto` (searched by hybridflow.placement.auto)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.config.bounds import bounded


@dataclass
class PlacementConfig:
    """`resources` maps role -> GPU list. Entries (see hybridflow.placement.resources):
    global ranks `3`, ranges `"0-3"`, `"all"`, and node-local forms `"node1:[0,1]"`, `"node1:0-3"`,
    `"node1:all"`.
    A role without an entry: ref takes the actor's GPUs; other enabled roles must be listed.
    `colocate` lists role groups that must share one GPU list (rollout vs actor is checked anyway).
    """

    mode: str = bounded("explicit", choices=("explicit", "auto"))
    resources: dict[str, list[Any]] = field(default_factory=dict)
    colocate: list[list[str]] = field(default_factory=list)
    check_memory: bool = True  # False: report over-capacity GPUs but do not fail
