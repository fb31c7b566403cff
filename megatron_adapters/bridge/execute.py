"""Run the reshard: stream the actor's training shards into the rollout layout, bucket by bucket.

Per bucket a rank (1) packs its own shards of the bucket's tensors into the micro-DP group's gather buffer,
cast to the rollout dtype on the way, and all-gathers it; (2) packs the rows other ranks need from it and
exchanges them point to point; (3) copies rows from its own shards, the gathered blocks and the received
transfers straight into the destination tensors. Extra memory at any time is one bucket's buffers (the
schedule bounds them by ``bucket_bytes``; a tensor larger than that is its own bucket).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from megatron_adapters.bridge.plan import ReshardPlan
from megatron_adapters.bridge.schedule import GATHER, OWN, RECV, BucketStep, ReshardSchedule
from megatron_adapters.bridge.shard_ranges import ShardGeometry, TargetFormat
from megatron_adapters.bridge.transport import build_transport
from megatron_adapters.bridge.vllm_layout import BridgeTensor, bridge_tensors
from megatron_adapters.cpu_backend import compute_device
from megatron_adapters.hf_safetensors import stage_entries
from megatron_adapters.hf_weights import Layout, te_alias
from megatron_adapters.lora import adapter_modules
from megatron_adapters.model import VOCAB_DIVISIBLE_BY, ModelShape, padded_vocab_size


@dataclass(frozen=True)
class ReshardStats:
    """What one ``reshard`` call did on this rank."""

    seconds: float
    bytes_received: int  # from other ranks (gathers and point-to-point)
    buckets: int
    bytes_written: int = 0  # into this rank's destination tensors (what the engine was given)

    def __add__(self, other: ReshardStats) -> ReshardStats:
        """Two reshards of one sync (the base once, then the adapters) as one."""
        return ReshardStats(self.seconds + other.seconds, self.bytes_received + other.bytes_received,
                            self.buckets + other.buckets, self.bytes_written + other.bytes_written)


def training_shards(model) -> dict[str, torch.Tensor]:
    """This rank's parameters keyed by their table (global-layer) megatron name: the bridge's input.

    The bridge moves base weights only; a model whose LoRA adapters are on would reach the engine without
    them, so it is refused: sync inside ``megatron_adapters.lora.adapters_merged(model)`` (merged weights).
    """
    if any(module.lora_enabled for _, module in adapter_modules(model)):
        raise ValueError(
            "bridge: the model's LoRA adapters are on and the bridge ships base weights only; "
            "sync inside megatron_adapters.lora.adapters_merged(model)"
        )
    params = dict(model.named_parameters())
    return {entry.mcore: params[name].detach() for entry, name in stage_entries(model)}


class WeightBridge:
    """Reshards actor weights into a rollout layout; build once, call ``reshard`` per update.

    Construction is collective over the whole world (it creates the micro-DP process groups): every rank
    builds it with the same plan, including ranks that are neither actor nor rollout. ``reshard`` is
    collective over the actor and rollout ranks.

    Args:
        plan: the static ``ReshardPlan`` (same on every rank).
        shape: the model's ``ModelShape``.
        target: ``TargetFormat.VLLM`` or ``TargetFormat.MEGATRON`` (the native engine at TP_g).
        dtype: rollout dtype; tensors are cast while packing, so bytes on the wire are rollout bytes.
        bucket_bytes: buffer budget per bucket on any rank.
        make_vocab_size_divisible_by: megatron's vocab padding unit (training and native target).
        device: where buffers live (default: the current CUDA device, else CPU).
        cache_views: reuse the copy views of own shards between calls while ``src``/``dst`` keep their
            storage (they hold references: call ``clear_view_cache`` before freeing either side).
        staged: ``dst`` will be one staging buffer reused by every bucket (``bucket_shapes``, an engine in
            its own process): destination bytes count toward ``bucket_bytes`` too.
        tensors: what it moves (default: the model's base weights, ``bridge_tensors``); the LoRA adapters
            are ``megatron_adapters.bridge.adapters.adapter_tensors`` (see ``with_tensors``).
    """

    def __init__(
        self,
        plan: ReshardPlan,
        shape: ModelShape,
        target: TargetFormat = TargetFormat.VLLM,
        dtype: torch.dtype = torch.bfloat16,
        bucket_bytes: int = 256 << 20,
        make_vocab_size_divisible_by: int = VOCAB_DIVISIBLE_BY,
        device: torch.device | None = None,
        cache_views: bool = True,
        staged: bool = False,
        tensors: list[BridgeTensor] | None = None,
    ) -> None:
        self.plan, self.shape, self.target, self.dtype = plan, shape, target, dtype
        self.device = device or compute_device()
        self.tensors = bridge_tensors(shape) if tensors is None else tensors
        self.bucket_bytes, self.staged = bucket_bytes, staged
        train = ShardGeometry(
            TargetFormat.MEGATRON,
            plan.train.tp,
            padded_vocab_size(shape.vocab_size, plan.train.tp, make_vocab_size_divisible_by),
        )
        if target is TargetFormat.VLLM:
            self.geometry = ShardGeometry.vllm(shape, plan.gen.tp)
        else:
            if shape.num_kv_heads % plan.gen.tp:
                raise ValueError(
                    f"roles.rollout.parallel.tp: the native engine needs num_key_value_heads="
                    f"{shape.num_kv_heads} "
                    f"divisible by tp={plan.gen.tp}; choose such a tp or rollout.engine=vllm"
                )
            self.geometry = ShardGeometry.megatron(shape, plan.gen.tp, make_vocab_size_divisible_by)
        self.train_geometry = train
        self.rank = dist.get_rank()
        self.transport = build_transport(plan.micro_dp_groups())
        self.cache_views = cache_views
        self._schedule()

    def _schedule(self) -> None:
        element_size = torch.empty((), dtype=self.dtype).element_size()
        self.schedule = ReshardSchedule(self.plan, self.shape, self.tensors, self.train_geometry, self.geometry,
                                        self.bucket_bytes, element_size, self.staged)
        self.program = self.schedule.program(self.rank)
        self._row_numel = [math.prod(t.full_shape) // t.full_shape[t.dim] for t in self.tensors]
        self._view_cache: dict[int, tuple] = {}

    def with_tensors(self, tensors: list[BridgeTensor]) -> WeightBridge:
        """A bridge over the same plan, layouts and process groups that moves ``tensors`` instead (the LoRA
        adapters after the base went once). Not collective: it creates no groups."""
        other = copy.copy(self)
        other.tensors = tensors
        other._schedule()
        return other

    def clear_view_cache(self) -> None:
        """Drop cached views (and with them the references to the last ``src``/``dst`` tensors)."""
        self._view_cache.clear()

    def target_shapes(self) -> dict[str, tuple[int, ...]]:
        """Names and shapes of this rank's rollout tensors (empty on a training-only rank)."""
        slot = self.plan.slots.get(self.rank)
        if slot is None:
            return {}
        return {t.name(self.target): t.shard_shape(self.shape, self.geometry, slot.tp_rank) for t in self.tensors}

    def bucket_shapes(self) -> list[dict[str, tuple[int, ...]]]:
        """This rank's rollout tensors grouped by bucket, in the order ``reshard`` completes them (a bucket
        holds whole tensors); empty on a training-only rank."""
        shapes = self.target_shapes()
        if not shapes:
            return []
        return [{self.tensors[x].name(self.target): shapes[self.tensors[x].name(self.target)] for x in step.tensors}
                for step in self.program]

    def allocate_targets(self) -> dict[str, torch.Tensor]:
        """Empty destination tensors (for callers without an engine that already owns them)."""
        return {n: torch.empty(s, dtype=self.dtype, device=self.device) for n, s in self.target_shapes().items()}

    @torch.no_grad()
    def reshard(
        self,
        src: dict[str, torch.Tensor],
        dst: dict[str, torch.Tensor] | None = None,
        on_bucket: Callable[[int], None] | None = None,
    ) -> tuple[dict, ReshardStats]:
        """Fill ``dst`` (rollout tensors by name; allocated if None) from ``src`` (``training_shards``).

        ``on_bucket(i)`` runs once the tensors of bucket ``i`` (``bucket_shapes()[i]``) are written (their
        copies may still be queued on the device): a staging ``dst``, whose buckets share one buffer, moves
        them on there before the next bucket overwrites it.
        """
        dst = self.allocate_targets() if dst is None else dst
        aligned = {}
        for name, shape in self.target_shapes().items():
            tensor = dst.get(name)
            if tensor is None and self.target is TargetFormat.MEGATRON:
                tensor = dst.get(te_alias(name))  # a Transformer Engine native engine fuses norms into linears
            if tensor is None or tuple(tensor.shape) != shape:
                got = None if tensor is None else tuple(tensor.shape)
                raise ValueError(f"bridge: destination {name!r} has shape {got}, the layout needs {shape}")
            aligned[name] = tensor
        unused = sorted(set(dst) - set(aligned) - {te_alias(n) for n in aligned})
        if unused:
            raise ValueError(f"bridge: destination tensors {unused} are not part of the {self.target.value} layout")
        start, received = time.perf_counter(), self.transport.bytes_received
        for index, step in enumerate(self.program):
            self._run_step(index, step, src, aligned)
            if on_bucket is not None and aligned:
                on_bucket(index)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        written = sum(t.numel() * t.element_size() for t in aligned.values())
        stats = ReshardStats(time.perf_counter() - start, self.transport.bytes_received - received, len(self.program),
                             written)
        return dst, stats

    def _view(self, flat: torch.Tensor, x: int, rows: int) -> torch.Tensor:
        t = self.tensors[x]
        shape = list(t.full_shape)
        shape[t.dim] = rows
        return flat.view(shape)

    def _train_rows(self, x: int, piece: int) -> int:
        return self.tensors[x].shard_shape(self.shape, self.train_geometry, piece)[self.tensors[x].dim]

    def _run_step(
        self, index: int, step: BucketStep, src: dict[str, torch.Tensor], dst: dict[str, torch.Tensor]
    ) -> None:
        names = [t.entry.mcore for t in self.tensors]
        gathered = None
        if step.gather is not None:
            gathered = torch.empty(sum(step.gather.member_numel), dtype=self.dtype, device=self.device)
            for x, offset, numel in step.gather.own:
                shard = src[names[x]]
                gathered[offset : offset + numel].view(shard.shape).copy_(shard)
            self.transport.all_gather(gathered, step.gather.member_numel, step.gather.group)
        sends, recvs = [], {}
        for peer, items in step.sends.items():
            buf = torch.empty(sum(i.numel for i in items), dtype=self.dtype, device=self.device)
            for i in items:
                part = src[names[i.tensor]].narrow(self.tensors[i.tensor].dim, i.row, i.length)
                self._view(buf[i.offset : i.offset + i.numel], i.tensor, i.length).copy_(part)
            sends.append((buf, peer))
        for peer, items in step.recvs.items():
            recvs[peer] = torch.empty(sum(i.numel for i in items), dtype=self.dtype, device=self.device)
        if sends or recvs:
            self.transport.exchange(sends, list((buf, peer) for peer, buf in recvs.items()))
        del sends
        zeros, pairs = self._local_pairs(index, step, src, dst)
        for view in zeros:
            view.zero_()  # vLLM / megatron padded vocabulary rows are zero
        for x, placements in step.assembly.items():
            t = self.tensors[x]
            out = dst[t.name(self.target)]
            for p in placements:
                c = p.copy
                if p.kind == GATHER:
                    rows = self._train_rows(x, c.piece)
                    source = self._view(gathered[p.offset : p.offset + rows * self._row_numel[x]], x, rows)
                elif p.kind == RECV:
                    numel = c.length * self._row_numel[x]
                    source = self._view(recvs[p.peer][p.offset : p.offset + numel], x, c.length)
                else:
                    continue
                pairs.append(_copy_views(out, source, t.dim, c))
        _copy_all(pairs)

    def _local_pairs(self, index: int, step: BucketStep, src: dict, dst: dict) -> tuple[list, list]:
        """(padding views to zero, (dst, src) view pairs from own shards), cached while tensors stay put.

        Building ~10 views per layer costs more CPU time than the GPU spends copying a small model, and
        training parameters and engine weights keep their storage between updates, so the views are reused.
        """
        key = (tuple(t.data_ptr() for t in src.values()), tuple(t.data_ptr() for t in dst.values()))
        cached = self._view_cache.get(index)
        if cached is not None and cached[0] == key:
            return cached[1], list(cached[2])
        slot, zeros, pairs = self.plan.slots.get(self.rank), [], []
        for x, placements in step.assembly.items():
            t = self.tensors[x]
            out = dst[t.name(self.target)]
            if t.entry.layout is Layout.VOCAB:
                covered = sum(b - a for a, b in t.ranges(self.shape, self.geometry, slot.tp_rank)[0])
                zeros.append(out.narrow(0, covered, out.shape[0] - covered))
            for p in placements:
                if p.kind == OWN:
                    pairs.append(_copy_views(out, src[t.entry.mcore], t.dim, p.copy))
        if self.cache_views:
            self._view_cache[index] = (key, zeros, pairs)
        return zeros, list(pairs)


def _copy_views(out: torch.Tensor, source: torch.Tensor, dim: int, c) -> tuple[torch.Tensor, torch.Tensor]:
    return _blocks(out, dim, c.dst, c.dst_step, c.length, c.count), _blocks(
        source, dim, c.src, c.src_step, c.length, c.count
    )


_FOREACH_MAX_NUMEL = 1 << 20


def _copy_all(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Copy (and cast) every pair.

    Small copies go through one ``_foreach_copy_`` call (per-copy launch overhead dominates them); large
    ones through ``copy_``, whose device-to-device path runs at full copy bandwidth (the foreach kernel does not).
    """
    small = [(d, s) for d, s in pairs if d.numel() < _FOREACH_MAX_NUMEL]
    if small:
        torch._foreach_copy_([d for d, _ in small], [s for _, s in small])
    for d, s in pairs:
        if d.numel() >= _FOREACH_MAX_NUMEL:
            d.copy_(s)


def _blocks(t: torch.Tensor, dim: int, start: int, step: int, length: int, count: int) -> torch.Tensor:
    """View of ``count`` blocks of ``length`` rows along ``dim``, the k-th starting at ``start + k * step``."""
    if count == 1:
        return t.narrow(dim, start, length)
    size, stride = list(t.shape), list(t.stride())
    view_size = size[:dim] + [count, length] + size[dim + 1 :]
    view_stride = stride[:dim] + [stride[dim] * step, stride[dim]] + stride[dim + 1 :]
    return t.as_strided(view_size, view_stride, t.storage_offset() + start * stride[dim])
