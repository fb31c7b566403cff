"""`python -m hybridflow.convert mcore-to-vllm`: a dist checkpoint (or HF directory) -> vLLM per-rank shards.

The work is `megatron_adapters.bridge.export.export_vllm_shards`; this module checks the input first, so a
bad one is one `error:` line naming the flag, and writes into a sibling directory that is renamed to
`--out` only when every shard is written (nothing half-written is left under `--out`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hybridflow.errors import UserError


def convert_to_vllm(ckpt: str, out: str, tp: int, hf_config: str | None, dtype=None) -> list[Path]:
    """Check `ckpt`/`out`/`tp` against the model, export, then move the result to `out`."""
    from megatron_adapters.bridge.export import _config_dir, export_vllm_shards
    from megatron_adapters.bridge.shard_ranges import ShardGeometry
    from megatron_adapters.bridge.vllm_layout import bridge_tensors
    from megatron_adapters.hf_safetensors import INDEX_FILE, SINGLE_FILE
    from megatron_adapters.model import model_shape

    source, target = Path(ckpt), Path(out)
    if tp < 1:
        raise UserError(f"--tp: must be >= 1, got {tp}")
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise UserError(f"--out: {target} exists and is not an empty directory; choose a new directory")
    if not any((source / name).is_file() for name in ("metadata.json", SINGLE_FILE, INDEX_FILE)):
        raise UserError(f"--ckpt: {source} is neither a megatron dist checkpoint (metadata.json) nor an HF model "
                        f"directory ({SINGLE_FILE}); point it at one")
    try:
        config_dir = _config_dir(source, hf_config)
    except ValueError as err:
        raise UserError(str(err)) from None
    if not (config_dir / "config.json").is_file():
        raise UserError(f"--hf-config: {config_dir} has no config.json; pass the HF model directory")
    shape = model_shape(config_dir)
    try:  # every rank's ranges, from shapes alone: a tp vLLM cannot shard fails here, before any file
        geometry = ShardGeometry.vllm(shape, tp)
        for tensor in bridge_tensors(shape):
            for rank in range(tp):
                tensor.ranges(shape, geometry, rank)
    except ValueError as err:
        raise UserError(f"--tp: {tp} cannot shard this model for vLLM ({_reason(err)}); choose another") from None
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        export_vllm_shards(source, staging, tp, hf_config=config_dir, dtype=dtype)
    except ValueError as err:
        shutil.rmtree(staging, ignore_errors=True)
        raise UserError(f"--ckpt: {_reason(err)}") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if target.exists():
        target.rmdir()  # empty, checked above
    os.replace(staging, target)
    return sorted(target.glob("rank*.safetensors"))


def _reason(err: ValueError) -> str:
    """The library's message without its own field prefix (this CLI names its flags instead)."""
    text = str(err)
    field, sep, rest = text.partition(": ")
    return rest if sep and " " not in field else text
