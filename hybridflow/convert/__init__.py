"""Offline checkpoint conversion between HF safetensors and megatron-core dist checkpoints.

    python -m hybridflow.convert hf-to-mcore --hf DIR --out DIR --tp T --pp P [--dtype auto|fp32|bf16]
    python -m hybridflow.convert mcore-to-hf --ckpt DIR --out DIR [--tp T --pp P] [--dtype auto|fp32|bf16]
    python -m hybridflow.convert mcore-to-vllm --ckpt DIR --out DIR --tp T [--hf-config DIR] [--dtype ...]
    python -m hybridflow.convert gguf-to-hf --gguf FILE --out DIR [--dtype auto|fp32|bf16]

Runs on CPU: it starts ``tp * pp`` local ranks itself (through `hybridflow.launch.launch_ranks`, the
launcher `python -m hybridflow.run` uses; forked, gloo) and each rank converts only its
shard (HF slices are read per rank; the dist checkpoint is TP x PP independent, so ``mcore-to-hf`` may use
any layout that fits, default 1 x 1). ``mcore-to-vllm`` (see `hybridflow.convert.vllm_shards`) writes one
safetensors file per vLLM TP rank in one process; ``gguf-to-hf`` (see `hybridflow.convert.gguf`) dequantises a
Llama/Qwen2/Qwen3 GGUF file into an HF checkpoint directory (auto dtype: fp32). Bad input: one line on stderr,
exit code 2.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from hybridflow.config.model import torch_dtype
from hybridflow.errors import cli_errors
from hybridflow.launch.ports import free_port

CONVERT_DTYPES = ("fp32", "bf16")  # the config dtypes (hybridflow.config.model.DTYPES) convert writes
CONVERT_TIMEOUT_S = 1800  # collectives of a large checkpoint's conversion may take minutes


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.convert", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="direction", required=True)
    to_mcore = sub.add_parser("hf-to-mcore", help="HF model directory -> megatron-core dist checkpoint")
    to_mcore.add_argument("--hf", required=True, help="local HF model directory (config.json + safetensors)")
    to_hf = sub.add_parser("mcore-to-hf", help="megatron-core dist checkpoint -> HF model directory")
    to_hf.add_argument("--ckpt", required=True,
                       help="dist checkpoint written by hf-to-mcore (a training run exports its actor as final_hf/)")
    to_vllm = sub.add_parser("mcore-to-vllm", help="megatron-core dist checkpoint (or HF dir) -> vLLM TP shards")
    to_vllm.add_argument("--ckpt", required=True, help="dist checkpoint, or an HF model directory")
    to_vllm.add_argument("--hf-config", default=None, help="HF config dir (default: --ckpt, its hf_config/, parent)")
    to_vllm.add_argument("--tp", type=int, required=True, help="vLLM tensor-parallel size")
    from_gguf = sub.add_parser("gguf-to-hf", help="GGUF file (Llama, Qwen2, Qwen3) -> HF model directory, dequantised")
    from_gguf.add_argument("--gguf", required=True, help="local .gguf file")
    for p in (to_mcore, to_hf, to_vllm, from_gguf):
        p.add_argument("--out", required=True, help="output directory (must be new or empty)")
        if p in (to_mcore, to_hf):
            p.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks to convert with")
            p.add_argument("--pp", type=int, default=1, help="pipeline-parallel ranks to convert with")
        p.add_argument(
            "--dtype",
            choices=["auto", *CONVERT_DTYPES],
            default="auto",
            help="weight dtype (auto: the source's config.json dtype, else fp32)",
        )
    return parser.parse_args(argv)


def _dtype(name: str, hf_config):
    import torch

    if name == "auto":
        source = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None) or "float32"
        return (
            source if isinstance(source, torch.dtype) else getattr(torch, str(source).removeprefix("torch."))
        )
    return torch_dtype(name)


def _validate(args: argparse.Namespace):
    """Check everything that can be checked before starting ranks; returns the HF config."""
    from hybridflow.trainer.resume import FINGERPRINT_FILE
    from megatron_adapters.checkpoint import checkpoint_hf_config
    from megatron_adapters.model import load_hf_config, transformer_config_from_hf

    for field in ("tp", "pp"):
        if getattr(args, field, 1) < 1:
            raise ValueError(f"--{field}: must be >= 1, got {getattr(args, field)}")
    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out: {out} exists and is not an empty directory; choose a new directory")
    if args.direction == "hf-to-mcore":
        source = Path(args.hf)
        if not (source / "config.json").is_file():
            raise ValueError(f"--hf: {source} has no config.json; point it at a local HF model directory")
        hf_config = load_hf_config(source)
    else:
        if not (Path(args.ckpt) / "metadata.json").is_file():
            raise ValueError(f"--ckpt: {args.ckpt} is not a megatron dist checkpoint (no metadata.json)")
        if (Path(args.ckpt) / FINGERPRINT_FILE).is_file():
            raise ValueError(f"--ckpt: {args.ckpt} is a training checkpoint (every role's state); the run exports "
                             "its actor as final_hf/ in its output directory, and running it again re-exports a "
                             "missing one")
        hf_config = checkpoint_hf_config(args.ckpt)
    # Architecture and divisibility checks; use_cpu_initialization given so the parent never touches CUDA.
    transformer_config_from_hf(hf_config, tp=args.tp, pp=args.pp, use_cpu_initialization=True)
    return hf_config


def _convert_rank(args: argparse.Namespace, hf_config) -> None:
    """One conversion rank, started by `hybridflow.launch.launch_ranks` (rank and rendezvous from its env)."""
    import torch.distributed as dist

    from hybridflow.config import DistributedConfig
    from hybridflow.launch import init_distributed

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    init_distributed(DistributedConfig(backend="gloo", timeout_s=CONVERT_TIMEOUT_S))
    try:
        from megatron_adapters.checkpoint import load_checkpoint, save_checkpoint
        from megatron_adapters.cpu_backend import enable_cpu_backend
        from megatron_adapters.hf_safetensors import load_hf_weights, save_hf_weights
        from megatron_adapters.model import build_gpt
        from megatron_adapters.process_groups import build_role_groups

        enable_cpu_backend()
        dtype = _dtype(args.dtype, hf_config)
        hf_config.dtype = dtype
        world = args.tp * args.pp
        model = build_gpt(hf_config, build_role_groups(list(range(world)), args.tp, args.pp, 1), dtype=dtype)
        if args.direction == "hf-to-mcore":
            load_hf_weights(model, args.hf)
            save_checkpoint(args.out, model, hf_config)
        else:
            load_checkpoint(args.ckpt, model)
            save_hf_weights(model, args.out, hf_config, dtype=dtype)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def convert(args: argparse.Namespace) -> None:
    """Validate, then run the conversion in ``tp * pp`` CPU ranks (ValueError on bad input)."""
    if args.direction == "gguf-to-hf":
        from hybridflow.convert.gguf import convert_gguf_to_hf

        convert_gguf_to_hf(args.gguf, args.out, "fp32" if args.dtype == "auto" else args.dtype)
        return
    if args.direction == "mcore-to-vllm":
        from hybridflow.convert.vllm_shards import convert_to_vllm

        dtype = None if args.dtype == "auto" else _dtype(args.dtype, None)  # auto: the checkpoint's own
        convert_to_vllm(args.ckpt, args.out, args.tp, args.hf_config, dtype)
        return
    hf_config = _validate(args)
    from hybridflow.config import DistributedConfig
    from hybridflow.launch import LaunchError, launch_ranks

    # Conversion is a CPU job: the ranks see no GPU. Forked even where CUDA exists: the parent has imported
    # torch + megatron but run no CUDA call, so children start in ~0 s.
    dist_cfg = DistributedConfig(master_port=free_port("127.0.0.1"), timeout_s=CONVERT_TIMEOUT_S)
    log_dir = Path(tempfile.mkdtemp(prefix="hybridflow-convert-"))
    try:
        launch_ranks(args.tp * args.pp, _convert_rank, (args, hf_config), dist_cfg, log_dir, devices="",
                     start_method="fork", quiet=True)
    except LaunchError as err:
        # A rank's bad input (megatron_adapters raises ValueError) stays one `error:` line; other failures
        # name the rank's log (kept).
        if err.first_error.startswith("ValueError: "):
            raise ValueError(err.first_error.removeprefix("ValueError: ")) from None
        raise
    shutil.rmtree(log_dir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with cli_errors():
        convert(args)
    source = {"hf-to-mcore": "hf", "gguf-to-hf": "gguf"}.get(args.direction, "ckpt")
    layout = "".join(f", {f}={getattr(args, f)}" for f in ("tp", "pp") if hasattr(args, f))
    print(f"converted {getattr(args, source)} -> {args.out} ({args.direction}{layout})")
    return 0
