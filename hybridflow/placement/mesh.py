"""One role's TP x DP x PP mesh over its global ranks (megatron's "tp-dp-pp" order: tp fastest)."""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

# Dimension names in megatron's order (fastest first); HyperCommGrid reverses them into array axes.
DIM_NAMES = ("tp", "dp", "pp")


@dataclass(frozen=True)
class ParallelDims:
    """A role's layout: tensor-, pipeline- and data-parallel degrees, each a positive integer (checked here,
    once, so every holder can trust them). The auto planner's `Strategy` is one with a generation TP added;
    a `RoleMesh` holds one as `dims`."""

    tp: int
    pp: int
    dp: int

    def __post_init__(self) -> None:
        for name in ("tp", "pp", "dp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
                raise ValueError(f"{type(self).__name__}.{name}: {value!r} is not a positive integer")

    @property
    def size(self) -> int:
        """GPUs the layout spans: tp x pp x dp."""
        return self.tp * self.pp * self.dp


@dataclass(frozen=True)
class RoleMesh:
    """`ranks[i]` holds mesh position i = pp_rank * (dp * tp) + dp_rank * tp + tp_rank.

    Groups are enumerated exactly like megatron-core's `HyperCommGrid(shape=[tp, dp, pp],
    dim_names=["tp", "dp", "pp"])` over positions, then mapped through `ranks`, so groups built from a
    plan equal megatron's when the ranks are contiguous.
    """

    role: str
    ranks: tuple[int, ...]
    dims: ParallelDims  # its degrees, checked when they were made

    def __post_init__(self) -> None:
        if not isinstance(self.dims, ParallelDims):
            raise TypeError(f"{self.role}: dims is a {type(self.dims).__name__}, not ParallelDims")
        if len(self.ranks) != self.dims.size:
            raise ValueError(f"{self.role}: {len(self.ranks)} ranks != tp*pp*dp = {self.dims.size}")

    @property
    def tp(self) -> int:
        return self.dims.tp

    @property
    def pp(self) -> int:
        return self.dims.pp

    @property
    def dp(self) -> int:
        return self.dims.dp

    @property
    def size(self) -> int:
        return len(self.ranks)

    def _groups(self, dim: str) -> list[tuple[int, ...]]:
        shape = {"tp": self.tp, "dp": self.dp, "pp": self.pp}
        reversed_names = DIM_NAMES[::-1]
        positions = np.arange(self.size).reshape([shape[d] for d in reversed_names])
        moved = np.moveaxis(positions, reversed_names.index(dim), -1).reshape(-1, shape[dim])
        return [tuple(self.ranks[i] for i in row) for row in moved.tolist()]

    def tp_groups(self) -> list[tuple[int, ...]]:
        return self._groups("tp")

    def dp_groups(self) -> list[tuple[int, ...]]:
        return self._groups("dp")

    def pp_groups(self) -> list[tuple[int, ...]]:
        return self._groups("pp")

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(tp_rank, dp_rank, pp_rank) of a global rank in this mesh."""
        i = self.ranks.index(rank)
        return i % self.tp, (i // self.tp) % self.dp, i // (self.tp * self.dp)

    def rank_at(self, tp_rank: int, dp_rank: int, pp_rank: int) -> int:
        return self.ranks[pp_rank * self.dp * self.tp + dp_rank * self.tp + tp_rank]

    def to_json(self) -> dict:
        return {
            "ranks": list(self.ranks),
            "tp": self.tp,
            "pp": self.pp,
            "dp": self.dp,
            "tp_groups": [list(g) for g in self.tp_groups()],
            "dp_groups": [list(g) for g in self.dp_groups()],
            "pp_groups": [list(g) for g in self.pp_groups()],
        }

    @classmethod
    def from_json(cls, role: str, data: dict) -> RoleMesh:
        """The mesh `to_json` wrote (its groups are derived from ranks and sizes, so they are not read)."""
        return cls(role, tuple(data["ranks"]), ParallelDims(data["tp"], data["pp"], data["dp"]))
