"""Offline export: a megatron-core distributed checkpoint (or an HF directory) -> per-rank vLLM safetensors.

``export_vllm_shards(ckpt_dir, out_dir, tp)`` writes ``rank{r}.safetensors`` for every vLLM TP rank ``r``,
tensors named and shaped as vLLM's model holds them (see ``vllm_layout``), plus ``vllm_shards.json``
(tp, padded vocabulary, names and shapes) and a copy of ``config.json`` when one is found.

A megatron dist checkpoint is read with ``megatron.core.dist_checkpointing.load_plain_tensors``, which
returns every tensor whole: megatron's TP=1 layout (``linear_qkv`` grouped per query group, ``linear_fc1`` =
``[gate; up]``, vocabulary padded as in training). Each tensor is then one source piece for the same range
arithmetic the online bridge uses.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from megatron_adapters.bridge.shard_ranges import ShardGeometry, TargetFormat, plan_copies
from megatron_adapters.bridge.vllm_layout import BridgeTensor, bridge_tensors, shards_from_hf
from megatron_adapters.hf_safetensors import INDEX_FILE, SINGLE_FILE, SafetensorsReader
from megatron_adapters.hf_weights import WeightMapping, local_name, te_alias
from megatron_adapters.model import ModelShape, model_shape

CONFIG_FILE = "config.json"
MANIFEST_FILE = "vllm_shards.json"


def export_vllm_shards(
    ckpt_dir: str | os.PathLike,
    out_dir: str | os.PathLike,
    tp: int,
    hf_config: str | os.PathLike | None = None,
    dtype: torch.dtype | None = None,
) -> list[Path]:
    """Write ``rank{r}.safetensors`` (r < tp) in vLLM's per-rank layout; returns the written files.

    Args:
        ckpt_dir: megatron dist checkpoint directory, or an HF model directory (``model.safetensors``).
        out_dir: created if missing.
        tp: vLLM tensor-parallel size.
        hf_config: directory with the model's HF ``config.json`` (default: ``ckpt_dir`` or its parent).
        dtype: output dtype (default: the checkpoint's).
    """
    ckpt, out = Path(ckpt_dir), Path(out_dir)
    config_dir = _config_dir(ckpt, hf_config)
    shape = model_shape(config_dir)
    geometry = ShardGeometry.vllm(shape, tp)
    out.mkdir(parents=True, exist_ok=True)
    if (ckpt / SINGLE_FILE).exists() or (ckpt / INDEX_FILE).exists():
        reader = SafetensorsReader(ckpt)
        hf = {name: reader.read(name, None, 0, 0) for t in bridge_tensors(shape) for name in t.entry.hf}
        shards = [shards_from_hf(hf, shape, geometry, r, dtype) for r in range(tp)]
    else:
        shards = _shards_from_mcore(ckpt, shape, geometry, dtype)
    files = []
    for rank, shard in enumerate(shards):
        path = out / f"rank{rank}.safetensors"
        save_file(
            {n: t.contiguous() for n, t in shard.items()},
            str(path),
            metadata={"tp": str(tp), "rank": str(rank)},
        )
        files.append(path)
    manifest = {
        "tp": tp,
        "padded_vocab": geometry.padded_vocab,
        "tensors": {r: {n: list(t.shape) for n, t in s.items()} for r, s in enumerate(shards)},
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1))
    if (config_dir / CONFIG_FILE).exists() and config_dir.resolve() != out.resolve():
        shutil.copy(config_dir / CONFIG_FILE, out / CONFIG_FILE)
    return files


def _config_dir(ckpt: Path, hf_config) -> Path:
    if hf_config is not None:
        return Path(hf_config)
    for candidate in (ckpt, ckpt / "hf_config", ckpt.parent):  # hf_config/: megatron_adapters.checkpoint
        if (candidate / CONFIG_FILE).exists():
            return candidate
    raise ValueError(f"--hf-config: no {CONFIG_FILE} in {ckpt}, its hf_config/ or parent; pass the HF model dir")


def _shards_from_mcore(ckpt: Path, shape: ModelShape, geometry: ShardGeometry, dtype):
    tensors = bridge_tensors(shape)
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(geometry.tp)]
    for t, tensor in zip(tensors, _load_mcore_tensors(ckpt, tensors), strict=True):
        source_geometry = ShardGeometry(TargetFormat.MEGATRON, 1, tensor.shape[0])  # whole tensor = TP 1
        source, _ = t.ranges(shape, source_geometry, 0)
        for rank in range(geometry.tp):
            target, _ = t.ranges(shape, geometry, rank)
            dst = torch.zeros(t.shard_shape(shape, geometry, rank), dtype=dtype or tensor.dtype)
            for c in plan_copies({0: source}, target):
                dst.narrow(t.dim, c.dst, c.length).copy_(tensor.narrow(t.dim, c.src, c.length))
            shards[rank][t.name(TargetFormat.VLLM)] = dst
    return shards


def _load_mcore_tensors(ckpt: Path, tensors: list[BridgeTensor]) -> list[torch.Tensor]:
    """Whole tensors of the model (only those: optimizer state in the checkpoint is not read)."""
    from megatron.core.dist_checkpointing import load, load_tensors_metadata

    with _single_process_group():
        metadata = load_tensors_metadata(str(ckpt))
        prefix = _key_prefix(metadata, tensors[0].entry.mcore)
        where = [_mcore_key(metadata, prefix, t.entry) for t in tensors]
        wanted = {key: metadata[key] for key in {key for key, _ in where}}
        loaded = load(wanted, str(ckpt), validate_access_integrity=False)
    return [loaded[key] if layer is None else loaded[key][layer] for key, layer in where]


def _mcore_key(keys, prefix: str, entry: WeightMapping) -> tuple[str, int | None]:
    """(checkpoint key, layer index in it or None) of ``entry``: megatron saves a block's layers stacked on a
    leading layer dim under ``decoder.layers.<param>`` (the layer is a sharded offset)."""
    candidates = [(prefix + entry.mcore, None)]
    if entry.layer is not None:
        block, layers, _, param = local_name(entry, entry.layer).split(".", 3)  # decoder.layers.0.<param>
        candidates.append((f"{prefix}{block}.{layers}.{param}", entry.layer))
    candidates += [(te_alias(key), layer) for key, layer in candidates]
    for key, layer in candidates:
        if key in keys:
            return key, layer
    raise ValueError(f"ckpt: tensor {entry.mcore!r} is missing; is this a checkpoint of this model?")


def _key_prefix(keys, first_name: str) -> str:
    """The prefix the saver put before megatron names, found from the embedding key (the shortest one:
    optimizer state keys end with the same name)."""
    prefixes = [key[: -len(first_name)] for key in keys if key.endswith(first_name)]
    if not prefixes:
        raise ValueError(f"ckpt: no {first_name!r} tensor; not a megatron-core GPT checkpoint")
    return min(prefixes, key=len)


@contextlib.contextmanager
def _single_process_group():
    """dist_checkpointing needs a process group; outside a launcher, make a 1-rank gloo one."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
