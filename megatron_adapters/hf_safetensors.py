"""HF safetensors checkpoints <-> this rank's megatron-core shards, driven by ``hf_weights.weight_table``.

Loading: each rank opens the checkpoint (single ``model.safetensors`` or a sharded ``*.index.json``) and
reads, with ``safe_open(...).get_slice``, only the rows/columns its TP shard and pipeline stage own, so
peak extra memory is one tensor slice, not the model. Export: each pipeline stage's TP rank 0 (of DP rank
0) gathers its stage over TP and writes one safetensors file; the index and config.json are computed from
the table, so no stage waits on another.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from megatron.core.transformer.transformer_layer import get_transformer_layer_offset
from safetensors import safe_open
from safetensors.torch import save_file

from megatron_adapters.hf_weights import (
    ShardSpec,
    WeightMapping,
    hf_to_mcore_shard,
    local_name,
    mcore_full_to_hf,
    te_alias,
    weight_table,
)
from megatron_adapters.lora import is_adapter_param
from megatron_adapters.model import load_hf_config

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class SafetensorsReader:
    """Slice reads from a local HF checkpoint directory (single file or sharded index)."""

    def __init__(self, hf_dir: str | os.PathLike) -> None:
        root = Path(hf_dir)
        if (root / INDEX_FILE).exists():
            weight_map = json.loads((root / INDEX_FILE).read_text())["weight_map"]
            self.files = {name: root / file for name, file in weight_map.items()}
        elif (root / SINGLE_FILE).exists():
            with safe_open(root / SINGLE_FILE, framework="pt") as f:
                self.files = {name: root / SINGLE_FILE for name in f.keys()}
        else:
            raise ValueError(
                f"hf: {root} has neither {SINGLE_FILE} nor {INDEX_FILE}; point it at an HF model directory"
            )
        self._handles: dict[Path, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def _handle(self, path: Path):
        if path not in self._handles:
            self._handles[path] = safe_open(path, framework="pt")
        return self._handles[path]

    def read(self, name: str, dim: int | None, start: int, stop: int) -> torch.Tensor:
        """Tensor ``name`` restricted to ``[start, stop)`` along ``dim`` (whole tensor if dim is None)."""
        if name not in self.files:
            raise ValueError(f"hf: tensor {name!r} is missing from the checkpoint; is this the right model?")
        piece = self._handle(self.files[name]).get_slice(name)
        if dim is None:
            return piece[:]
        return piece[start:stop] if dim == 0 else piece[:, start:stop]


def stage_layer_offset(model) -> int:
    """The global index of this rank's pipeline stage's first layer."""
    return get_transformer_layer_offset(model.config, None, model.pg_collection.pp.rank())


def stage_entries(model) -> list[tuple[WeightMapping, str]]:
    """(table entry, local parameter name) for every parameter on this rank's stage, checked both ways.

    Raises ValueError if a model parameter has no table entry or an entry has no parameter. LoRA adapter
    weights are not base weights and are left out (``megatron_adapters.peft_export`` maps those).
    """
    params = {name: p for name, p in model.named_parameters() if not is_adapter_param(p)}
    offset, count = stage_layer_offset(model), len(model.decoder.layers)
    pairs, seen = [], set()
    for entry in weight_table(model.hf_shape, model.head):
        if entry.layer is not None and not offset <= entry.layer < offset + count:
            continue
        name = local_name(entry, offset)
        name = name if name in params else te_alias(name)
        if name in params:
            pairs.append((entry, name))
            seen.add(name)
        elif not _off_stage(entry, model):
            raise ValueError(
                f"weights: model has no parameter {name!r} for HF {entry.hf}; unsupported model layout"
            )
    unmapped = sorted(set(params) - seen)
    if unmapped:
        raise ValueError(f"weights: parameters {unmapped} have no HF mapping; unsupported model layout")
    return pairs


def _off_stage(entry: WeightMapping, model) -> bool:
    """Entries whose parameter legitimately lives on another stage (or is shared with the embedding)."""
    if entry.mcore.startswith("embedding."):
        return not model.pre_process
    if entry.mcore.startswith(("decoder.final_layernorm", "output_layer")):
        return not model.post_process or entry.tied
    return False


def _shard_spec(model) -> ShardSpec:
    tp = model.pg_collection.tp
    padded = model.vocab_size
    return ShardSpec(tp=tp.size(), tp_rank=tp.rank(), padded_vocab=padded)


def hf_shards(model, hf_dir: str | os.PathLike, allow_missing_head: bool = True):
    """Yield (parameter name, this rank's shard as the checkpoint stores it) for every weight of ``model``'s
    stage, and (None, hf name) for a value/reward head the checkpoint lacks (when ``allow_missing_head``).

    The shard keeps the checkpoint's dtype (an fp32 checkpoint stays fp32), checked against the parameter's
    shape: any other missing tensor or shape mismatch raises ValueError.
    """
    reader = SafetensorsReader(hf_dir)
    params = dict(model.named_parameters())
    spec = _shard_spec(model)
    for entry, name in stage_entries(model):
        if allow_missing_head and entry.hf == ("score.weight",) and "score.weight" not in reader:
            yield None, "score.weight"
            continue
        shard = hf_to_mcore_shard(entry, reader.read, model.hf_shape, spec)
        if tuple(shard.shape) != tuple(params[name].shape):
            raise ValueError(
                f"weights: {entry.hf} gives shape {tuple(shard.shape)} for {name!r}, "
                f"model has {tuple(params[name].shape)}"
            )
        yield name, shard


@torch.no_grad()
def load_hf_weights(model, hf_dir: str | os.PathLike, allow_missing_head: bool = True) -> list[str]:
    """Copy an HF checkpoint into ``model`` (this rank's shards only). Returns HF names left at init.

    A value/reward head absent from a causal-LM checkpoint (critic initialised from the actor) keeps its
    random init when ``allow_missing_head``; any other missing tensor or shape mismatch raises ValueError.
    """
    params = dict(model.named_parameters())
    skipped = []
    for name, shard in hf_shards(model, hf_dir, allow_missing_head):
        if name is None:
            skipped.append(shard)
        else:
            params[name].copy_(shard)
    return skipped


def stage_file_name(pp_rank: int, pp: int) -> str:
    """The safetensors file a pipeline stage writes on export."""
    return f"model-{pp_rank + 1:05d}-of-{pp:05d}.safetensors"


def export_index(shape, head: str, pp_layers: list[range]) -> dict[str, str]:
    """HF name -> stage file for the whole model, from the table and each stage's global layer range."""
    pp = len(pp_layers)
    weight_map = {}
    for entry in weight_table(shape, head):
        if entry.tied:
            continue
        if entry.layer is not None:
            stage = next(s for s, layers in enumerate(pp_layers) if entry.layer in layers)
        else:
            stage = 0 if entry.mcore.startswith("embedding.") else pp - 1
        for hf_name in entry.hf:
            weight_map[hf_name] = stage_file_name(stage, pp)
    return weight_map


def _gather_tp(tensor: torch.Tensor, dim: int | None, tp_group) -> torch.Tensor:
    if dim is None or tp_group.size() == 1:
        return tensor
    parts = [torch.empty_like(tensor) for _ in range(tp_group.size())]
    dist.all_gather(parts, tensor.contiguous(), group=tp_group)
    return torch.cat(parts, dim=dim)


@torch.no_grad()
def save_hf_weights(model, out_dir: str | os.PathLike, hf_config, dtype: torch.dtype | None = None) -> None:
    """Write ``model`` as an HF checkpoint (sharded safetensors + index + config.json) into ``out_dir``.

    Collective over the model's TP group; call on every rank of the role (DP replicas > 0 return at once).
    """
    pg = model.pg_collection
    if hasattr(pg, "dp") and pg.dp.rank() != 0:
        return
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    for entry, name in stage_entries(model):
        if entry.tied:
            continue
        full = _gather_tp(params[name].detach(), entry.tp_dim, pg.tp)
        for hf_name, t in mcore_full_to_hf(entry, full, model.hf_shape, pg.tp.size()).items():
            tensors[hf_name] = t.to(dtype or t.dtype).contiguous()
    if pg.tp.rank() != 0:
        return
    pp, pp_rank = pg.pp.size(), pg.pp.rank()
    save_file(tensors, out / stage_file_name(pp_rank, pp), metadata={"format": "pt"})
    if pp_rank == 0:
        n = model.hf_shape.num_layers
        layers = [range(s * n // pp, (s + 1) * n // pp) for s in range(pp)]
        index = {"metadata": {}, "weight_map": export_index(model.hf_shape, model.head, layers)}
        (out / INDEX_FILE).write_text(json.dumps(index, indent=2))
        load_hf_config(hf_config).save_pretrained(out)
