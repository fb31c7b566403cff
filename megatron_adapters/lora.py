"""LoRA adapters over megatron-core's tensor-parallel linears: ``y = base(x) + (alpha / rank) * B(A(dropout(x)))``.

megatron-core 0.19 has no LoRA; these are subclasses of its ``ColumnParallelLinear`` / ``RowParallelLinear``
that keep the base parameters under their usual names (so the HF weight table and checkpoints see the same
model) and add ``lora_a`` / ``lora_b.<part>``. ``megatron_adapters.specs`` puts them into the layer spec.

TP sharding (the layouts Megatron-Bridge also uses):
- column-parallel base (``linear_qkv``, ``linear_fc1``): ``A`` is replicated on every TP rank (it reads the full
  input); ``B`` is sharded by output rows like the base weight. The rank intermediate ``A x`` passes through
  ``copy_to_tensor_model_parallel_region``, so its gradient is summed over the TP ranks' output shards and
  ``A`` gets the same full gradient everywhere.
- row-parallel base (``linear_proj``, ``linear_fc2``): ``A`` is sharded by input columns like the base weight;
  ``A x`` is summed over TP (an all-reduce of ``rank`` values per token) and ``B`` is replicated.

Fused bases hold one adapter per HF projection, as HF PEFT does: ``linear_qkv`` has separate ``B`` for q, k and
v, ``linear_fc1`` for gate and up; their ``A`` rows are stacked into one ``lora_a`` (one matmul over the shared
input). The part outputs are interleaved into megatron's per-TP-shard layout (per query group q|k|v; gate|up).
That is the only layout that is exactly PEFT's model, so PEFT adapters load and export without any fitting.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    set_tensor_model_parallel_attributes,
)
from megatron.core.tensor_parallel.mappings import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

# Megatron names of the linears that can carry adapters and whether their base is fused (several HF tensors).
LORA_TARGETS = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


@dataclass(frozen=True)
class LoraSettings:
    """One role's adapters (``roles.<role>.lora``): rank, alpha (scale alpha / rank), dropout, targets."""

    rank: int
    alpha: float
    dropout: float = 0.0
    target_modules: tuple[str, ...] = LORA_TARGETS

    def __post_init__(self) -> None:
        if self.rank < 1:
            raise ValueError(f"lora.rank: {self.rank} must be a positive integer (e.g. 16)")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"lora.dropout: {self.dropout} must be in [0, 1)")
        unknown = sorted(set(self.target_modules) - set(LORA_TARGETS))
        if unknown or not self.target_modules:
            raise ValueError(f"lora.target_modules: {unknown or '[]'} is not valid; use some of {list(LORA_TARGETS)}")

    @property
    def scaling(self) -> float:
        """The factor on ``B A x`` (PEFT's ``lora_alpha / r``)."""
        return self.alpha / self.rank


def _adapter_param(full: torch.Tensor, shard_dim: int | None, tp_rank: int, tp: int) -> torch.nn.Parameter:
    """This TP rank's slice of ``full`` as an adapter parameter with megatron's TP attributes."""
    if shard_dim is not None:
        full = full.chunk(tp, dim=shard_dim)[tp_rank]
    param = torch.nn.Parameter(full.contiguous())
    if shard_dim is not None:
        set_tensor_model_parallel_attributes(param, is_parallel=True, dim=shard_dim, stride=1)
    param.lora_adapter = True  # read by is_adapter_param; the base weights stay unmarked
    return param


def _lora_a_init(rows: int, in_features: int, like: torch.Tensor) -> torch.Tensor:
    """PEFT's default A init (kaiming-uniform, a=sqrt(5): U(+-1/sqrt(in))), drawn for the whole matrix from
    torch's default generator, which a role seeds alike on its TP ranks: the same A at any TP degree."""
    bound = 1.0 / math.sqrt(in_features)
    full = torch.empty(rows, in_features, dtype=torch.float32).uniform_(-bound, bound)
    return full.to(dtype=like.dtype, device=like.device)


def interleave_parts(parts: list[torch.Tensor], groups: int, dim: int) -> torch.Tensor:
    """Concatenate per-part tensors group by group along ``dim`` (megatron's fused per-shard order)."""
    dim = dim % parts[0].dim()
    split = [p.unflatten(dim, (groups, -1)) for p in parts]
    return torch.cat(split, dim=dim + 1).flatten(dim, dim + 1)


def _fused_layout(fused: str | None, config, out_per_partition: int, tp: int) -> tuple[int, tuple[int, ...]]:
    """(groups, per-group width of each part) of a column-parallel output shard."""
    if fused == "qkv":
        d = config.kv_channels
        q_per_group = config.num_attention_heads // config.num_query_groups
        return config.num_query_groups // tp, (q_per_group * d, d, d)
    if fused == "gate_up":
        return 1, (out_per_partition // 2, out_per_partition // 2)
    return 1, (out_per_partition,)


class LoraAdapted:
    """What both adapted linears share: the switch, the scale, dropout and the merged delta."""

    lora_a: torch.nn.Parameter
    lora_b: torch.nn.ParameterList

    def _init_adapter(self, settings: LoraSettings) -> None:
        if self.sequence_parallel:
            raise ValueError("lora: adapters do not support sequence_parallel yet; set sequence_parallel=false")
        self.lora_settings = settings
        self.lora_enabled = True
        self.lora_dropout = torch.nn.Dropout(settings.dropout) if settings.dropout else torch.nn.Identity()
        for param in self.parameters(recurse=False):
            if not getattr(param, "lora_adapter", False):
                param.requires_grad_(False)

    def delta_weight(self) -> torch.Tensor:
        """``(alpha / rank) * B @ A`` in this rank's base-weight layout (what merging adds)."""
        raise NotImplementedError

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        """The base's dist-checkpoint entries plus the adapters', each split along its own TP dimension
        (megatron's linears name only ``weight``/``bias``; anything else would be saved as TP-replicated)."""
        axes = {name: param.partition_dim for name, param in self.named_parameters()
                if getattr(param, "tensor_model_parallel", False)}
        return make_sharded_tensors_for_checkpoint(
            self.state_dict(prefix="", keep_vars=True), prefix, axes, sharded_offsets,
            tp_group=self.tp_group, dp_cp_group=metadata["dp_cp_group"],
        )


class LoraColumnParallelLinear(LoraAdapted, ColumnParallelLinear):
    """``ColumnParallelLinear`` + adapter: ``A`` replicated ``[parts * rank, in]``, ``B`` per part sharded."""

    def __init__(self, input_size: int, output_size: int, *, lora: LoraSettings, fused: str | None = None,
                 **kwargs) -> None:
        super().__init__(input_size, output_size, **kwargs)
        if self.gather_output:
            raise ValueError("lora: a column-parallel base with gather_output=True is not supported")
        tp, tp_rank = self.tp_group.size(), self.tp_group.rank()
        self.groups, widths = _fused_layout(fused, self.config, self.output_size_per_partition, tp)
        rank = lora.rank
        self.lora_a = _adapter_param(_lora_a_init(len(widths) * rank, input_size, self.weight), None, tp_rank, tp)
        self.lora_b = torch.nn.ParameterList(
            _adapter_param(torch.zeros(self.groups * w * tp, rank, dtype=self.weight.dtype, device=self.weight.device),
                           0, tp_rank, tp)
            for w in widths
        )
        self._init_adapter(lora)

    def forward(self, input_, weight=None, runtime_gather_output=None):
        """The base output plus the scaled adapter output, in the base's (output, bias) form."""
        output, bias = super().forward(input_, weight, runtime_gather_output)
        if not self.lora_enabled:
            return output, bias
        # the input is the same on every TP rank, and so is its dropout mask (torch's default generator,
        # seeded alike on a role's TP ranks, as for megatron's other replicated-activation dropouts)
        hidden = F.linear(self.lora_dropout(input_), self.lora_a)
        hidden = copy_to_tensor_model_parallel_region(hidden, group=self.tp_group)
        rank = self.lora_settings.rank
        parts = [F.linear(h, b) for h, b in zip(hidden.split(rank, dim=-1), self.lora_b, strict=True)]
        # one kernel for the scale and the sum (and none for the scale's gradient at alpha = rank): at 135M the
        # adapters' small kernels, not their FLOPs, slowed the step (benchmarks/README.md, stop 47)
        return torch.add(output, interleave_parts(parts, self.groups, dim=-1), alpha=self.lora_settings.scaling), bias

    def delta_weight(self) -> torch.Tensor:
        a_parts = self.lora_a.split(self.lora_settings.rank, dim=0)
        parts = [b @ a for b, a in zip(self.lora_b, a_parts, strict=True)]
        return self.lora_settings.scaling * interleave_parts(parts, self.groups, dim=0)


class LoraRowParallelLinear(LoraAdapted, RowParallelLinear):
    """``RowParallelLinear`` + adapter: ``A`` sharded ``[rank, in / tp]``, ``B`` replicated ``[out, rank]``."""

    def __init__(self, input_size: int, output_size: int, *, lora: LoraSettings, **kwargs) -> None:
        super().__init__(input_size, output_size, **kwargs)
        if not self.input_is_parallel:
            raise ValueError("lora: a row-parallel base with input_is_parallel=False is not supported")
        tp, tp_rank = self.tp_group.size(), self.tp_group.rank()
        self.groups = 1
        self.lora_a = _adapter_param(_lora_a_init(lora.rank, input_size, self.weight), 1, tp_rank, tp)
        zeros = torch.zeros(output_size, lora.rank, dtype=self.weight.dtype, device=self.weight.device)
        self.lora_b = torch.nn.ParameterList([_adapter_param(zeros, None, tp_rank, tp)])
        self._init_adapter(lora)

    def forward(self, input_):
        """The base output plus the scaled adapter output, in the base's (output, bias) form."""
        output, bias = super().forward(input_)
        if not self.lora_enabled:
            return output, bias
        if self.training and self.lora_settings.dropout:
            # the input is split over TP: each shard its own mask, from megatron's tensor-parallel RNG
            with get_cuda_rng_tracker().fork():
                input_ = self.lora_dropout(input_)
        hidden = F.linear(input_, self.lora_a)
        hidden = reduce_from_tensor_model_parallel_region(hidden, group=self.tp_group)
        return torch.add(output, F.linear(hidden, self.lora_b[0]), alpha=self.lora_settings.scaling), bias

    def delta_weight(self) -> torch.Tensor:
        return self.lora_settings.scaling * (self.lora_b[0] @ self.lora_a)


def lora_module_spec(base: type, settings: LoraSettings, fused: str | None = None) -> ModuleSpec:
    """The spec entry that builds ``base``'s adapted class (megatron-core's local TP linears only)."""
    if base is ColumnParallelLinear:
        return ModuleSpec(module=LoraColumnParallelLinear, params={"lora": settings, "fused": fused})
    if base is RowParallelLinear:
        return ModuleSpec(module=LoraRowParallelLinear, params={"lora": settings})
    raise ValueError(
        f"lora: adapters wrap megatron-core ColumnParallelLinear/RowParallelLinear, not {base.__name__}; "
        "use spec='sdpa' (or 'decode') with lora"
    )


def is_adapter_param(param: torch.nn.Parameter) -> bool:
    """Whether ``param`` is a LoRA adapter weight (not part of the base model)."""
    return getattr(param, "lora_adapter", False)


def adapter_modules(model: torch.nn.Module) -> Iterator[tuple[str, LoraAdapted]]:
    """(name, module) of every adapted linear in ``model``."""
    return ((name, m) for name, m in model.named_modules() if isinstance(m, LoraAdapted))


def freeze_base_weights(model: torch.nn.Module) -> None:
    """Only adapter weights train: megatron DDP then makes no grad buffers and the optimizer no state for
    the rest (both skip ``requires_grad=False`` parameters)."""
    for param in model.parameters():
        param.requires_grad_(is_adapter_param(param))


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module) -> Iterator[None]:
    """Run ``model`` as its base model (the reference role: the actor with adapters off, no second copy)."""
    modules = [m for _, m in adapter_modules(model)]
    previous = [m.lora_enabled for m in modules]
    for m in modules:
        m.lora_enabled = False
    try:
        yield
    finally:
        for m, state in zip(modules, previous, strict=True):
            m.lora_enabled = state


@contextlib.contextmanager
def adapters_merged(model: torch.nn.Module) -> Iterator[None]:
    """Hold ``W + (alpha / rank) B A`` in the base weights (adapters off), e.g. to export or ship merged
    weights; the original base weights come back bitwise on exit."""
    modules = [m for _, m in adapter_modules(model)]
    with torch.no_grad():
        originals = [m.weight.detach().clone() for m in modules]
    try:
        with torch.no_grad():
            for m in modules:
                m.weight.add_(m.delta_weight().to(m.weight.dtype))
        with adapters_disabled(model):
            yield
    finally:
        with torch.no_grad():
            for m, original in zip(modules, originals, strict=True):
                m.weight.copy_(original)
