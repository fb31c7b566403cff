"""Bucketed per-rank programs derived from a ``ReshardPlan``: what to gather, send, receive and copy where.

Every rank computes the same global schedule from static data (layouts, model shape), so senders and
receivers agree on every buffer offset without exchanging metadata. Tensors are grouped into buckets in
table order; a bucket holds whole tensors and at most ``bucket_bytes`` of gather + send + receive buffer on
any rank, plus its destination tensors when they are a staging buffer (``staged``); a single tensor larger
than that forms its own bucket.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from megatron_adapters.bridge.plan import GenerationRank, ReshardPlan
from megatron_adapters.bridge.shard_ranges import RowCopy, ShardGeometry, coalesce_strided, plan_copies
from megatron_adapters.bridge.vllm_layout import BridgeTensor
from megatron_adapters.hf_weights import Layout
from megatron_adapters.model import ModelShape

OWN, GATHER, RECV = "own", "gather", "recv"


@dataclass(frozen=True)
class Transfer:
    """Rows ``[row, row + length)`` of TP piece ``piece`` of ``tensor``, at ``offset`` in the p2p buffer."""

    tensor: int
    piece: int
    row: int
    length: int
    offset: int
    numel: int


@dataclass(frozen=True)
class Placement:
    """Fill target rows from a source: this rank's own shard, a gathered block, or a received transfer."""

    copy: RowCopy
    kind: str
    peer: int = -1
    offset: int = 0  # element offset of the gathered block / received transfer


@dataclass
class GatherStep:
    """One all-gather inside a micro-DP group: member i contributes ``member_numel[i]`` elements."""

    group: tuple[int, ...]
    member_numel: tuple[int, ...]
    own: list[tuple[int, int, int]]  # (tensor, offset, numel) of this rank's contribution


@dataclass
class BucketStep:
    """Everything one rank does for one bucket."""

    tensors: tuple[int, ...]
    gather: GatherStep | None = None
    sends: dict[int, list[Transfer]] = field(default_factory=dict)
    recvs: dict[int, list[Transfer]] = field(default_factory=dict)
    assembly: dict[int, list[Placement]] = field(default_factory=dict)


@dataclass
class _Need:
    copy: RowCopy
    kind: str
    peer: int  # gather member or p2p source


def _coalesce_local(needs: list[_Need]) -> list[_Need]:
    """Strided-merge consecutive copies from the same local source (received transfers stay per block)."""
    out: list[_Need] = []
    run: list[_Need] = []
    for need in [*needs, None]:
        if run and (need is None or need.kind == RECV or (need.kind, need.peer) != (run[0].kind, run[0].peer)):
            out += [_Need(c, run[0].kind, run[0].peer) for c in coalesce_strided([n.copy for n in run])]
            run = []
        if need is not None and need.kind == RECV:
            out.append(need)
        elif need is not None:
            run.append(need)
    return out


class ReshardSchedule:
    """Global static schedule for one (plan, model, target); ``program(rank)`` gives one rank's part."""

    def __init__(
        self,
        plan: ReshardPlan,
        shape: ModelShape,
        tensors: list[BridgeTensor],
        train_geometry: ShardGeometry,
        target_geometry: ShardGeometry,
        bucket_bytes: int,
        element_size: int,
        staged: bool = False,
    ) -> None:
        if train_geometry.tp != plan.train.tp or target_geometry.tp != plan.gen.tp:
            raise ValueError("bridge: geometries' tp must match the plan's layouts")
        self.plan, self.shape, self.tensors = plan, shape, tensors
        self.train_geometry, self.target_geometry = train_geometry, target_geometry
        self.bucket_numel = max(1, bucket_bytes // element_size)
        self.staged = staged  # destinations are a per-bucket staging buffer: their bytes count too
        self._copies: dict[tuple[int, int, int], list[RowCopy]] = {}
        self.needs = {rank: [self._needs(slot, x) for x in range(len(tensors))] for rank, slot in plan.slots.items()}
        self.buckets = self._pack_buckets()

    # ---- static facts ----------------------------------------------------------------------------------
    def stage(self, x: int) -> int:
        """Training pipeline stage holding tensor ``x`` (megatron's even split of layers over stages)."""
        entry, pp = self.tensors[x].entry, self.plan.train.pp
        if entry.layer is not None:
            return entry.layer // (self.shape.num_layers // pp)
        return pp - 1 if self.tensors[x].after_layers else 0

    def row_numel(self, x: int) -> int:
        t = self.tensors[x]
        return math.prod(t.full_shape) // t.full_shape[t.dim]

    def train_numel(self, x: int, piece: int) -> int:
        return math.prod(self.tensors[x].shard_shape(self.shape, self.train_geometry, piece))

    def holds(self, rank: int, x: int, piece: int | None = None) -> bool:
        """Whether ``rank`` trains TP shard ``piece`` (any, for None) of tensor ``x``'s stage."""
        if rank not in self.plan.train.ranks:
            return False
        tp, _, pp = self.plan.train.coords(rank)
        return pp == self.stage(x) and (piece is None or tp == piece)

    # ---- what each generation rank needs ---------------------------------------------------------------
    def _needs(self, slot: GenerationRank, x: int) -> list[_Need]:
        t, rank, stage = self.tensors[x], slot.rank, self.stage(x)
        group = slot.gather_group
        if t.entry.layout is Layout.REPLICATED:
            holders = [m for m in (rank, *group) if self.holds(m, x)]
            piece = self.plan.train.coords(holders[0])[0] if holders else 0
        else:
            piece = -1
        key = (x, slot.tp_rank, piece)
        if key not in self._copies:
            if piece >= 0:
                source = {piece: [(0, t.full_shape[t.dim])]}
            else:
                source = {i: t.ranges(self.shape, self.train_geometry, i)[0] for i in range(self.plan.train.tp)}
            target, _ = t.ranges(self.shape, self.target_geometry, slot.tp_rank)
            self._copies[key] = plan_copies(source, target)
        needs = []
        for c in self._copies[key]:
            if self.holds(rank, x, c.piece):
                needs.append(_Need(c, OWN, rank))
                continue
            member = next((m for m in group if self.holds(m, x, c.piece)), None)
            if member is not None:
                needs.append(_Need(c, GATHER, member))
            else:
                needs.append(_Need(c, RECV, self.plan.source_rank(slot, c.piece, stage)))
        return _coalesce_local(needs)

    def _gather_numel(self, group: tuple[int, ...], x: int) -> list[int]:
        return [self.train_numel(x, self.plan.train.coords(m)[0]) if self.holds(m, x) else 0 for m in group]

    def _cost(self, x: int) -> dict[int, int]:
        cost: dict[int, int] = {}
        for rank, slot in self.plan.slots.items():
            if slot.gather_group:
                cost[rank] = cost.get(rank, 0) + sum(self._gather_numel(slot.gather_group, x))
            if self.staged:
                target = self.tensors[x].shard_shape(self.shape, self.target_geometry, slot.tp_rank)
                cost[rank] = cost.get(rank, 0) + math.prod(target)
            for need in self.needs[rank][x]:
                if need.kind == RECV:
                    n = need.copy.length * self.row_numel(x)
                    cost[rank] = cost.get(rank, 0) + n
                    cost[need.peer] = cost.get(need.peer, 0) + n
        return cost

    def _pack_buckets(self) -> list[tuple[int, ...]]:
        buckets, current, load = [], [], {}
        for x in range(len(self.tensors)):
            cost = self._cost(x)
            merged = {r: load.get(r, 0) + cost.get(r, 0) for r in set(load) | set(cost)}
            if current and max(merged.values(), default=0) > self.bucket_numel:
                buckets.append(tuple(current))
                current, merged = [], cost
            current.append(x)
            load = merged
        if current:
            buckets.append(tuple(current))
        return buckets

    # ---- one rank's program ----------------------------------------------------------------------------
    def program(self, rank: int) -> list[BucketStep]:
        """Bucket steps of ``rank`` (a training-only rank only sends, a rollout-only rank only receives)."""
        return [self._step(rank, bucket) for bucket in self.buckets]

    def _step(self, rank: int, bucket: tuple[int, ...]) -> BucketStep:
        step = BucketStep(tensors=bucket)
        slot = self.plan.slots.get(rank)
        offsets: dict[tuple[int, int], int] = {}  # (tensor, member) -> gather offset
        if slot is not None and slot.gather_group:
            group, sizes, offset = slot.gather_group, [0] * len(slot.gather_group), 0
            own = []
            for i, member in enumerate(group):
                for x in bucket:
                    n = self._gather_numel(group, x)[i]
                    if n:
                        offsets[(x, member)] = offset
                        if member == rank:
                            own.append((x, offset, n))
                        offset += n
                        sizes[i] += n
            step.gather = GatherStep(group, tuple(sizes), own)
        cursor: dict[tuple[int, int], int] = {}
        for receiver in sorted(self.plan.slots):
            for x in bucket:
                for need in self.needs[receiver][x]:
                    if need.kind != RECV or rank not in (receiver, need.peer):
                        continue
                    pair = (need.peer, receiver)
                    numel = need.copy.length * self.row_numel(x)
                    item = Transfer(x, need.copy.piece, need.copy.src, need.copy.length, cursor.get(pair, 0), numel)
                    cursor[pair] = item.offset + numel
                    if need.peer == rank:
                        step.sends.setdefault(receiver, []).append(item)
                    if receiver == rank:
                        step.recvs.setdefault(need.peer, []).append(item)
                        step.assembly.setdefault(x, []).append(
                            Placement(
                                RowCopy(need.copy.piece, 0, need.copy.dst, need.copy.length),
                                RECV,
                                need.peer,
                                item.offset,
                            )
                        )
        if slot is not None:
            for x in bucket:
                for need in self.needs[rank][x]:
                    if need.kind == OWN:
                        step.assembly.setdefault(x, []).append(Placement(need.copy, OWN, rank))
                    elif need.kind == GATHER:
                        step.assembly.setdefault(x, []).append(
                            Placement(need.copy, GATHER, need.peer, offsets[(x, need.peer)])
                        )
                step.assembly.setdefault(x, [])
        return step
