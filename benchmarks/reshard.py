"""Resharding bridge benchmark: seconds and GB/s for one model shape and layout pair.

Single process (TP_t = TP_g = 1, the colocated hand-over: layout transform + copy):

    python benchmarks/reshard.py --shape 8b --target vllm                 # GPU
    python benchmarks/reshard.py --cpu-smoke                              # tiny shape on CPU

Several processes (torchrun sets RANK/WORLD_SIZE): ``--train-tp/--train-pp/--gen-tp`` over all ranks, colocated.
The floor is reading and writing the model's bytes once at the device copy bandwidth, measured here with one
large ``copy_`` (and reported next to the nominal ``--nominal-tbps``). Results go to stdout as JSON and, with
``--out``, to a dated markdown report.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hybridflow.config.model import DTYPES, torch_dtype  # noqa: E402
from hybridflow.placement import ParallelDims, RoleMesh  # noqa: E402
from megatron_adapters.bridge import (  # noqa: E402  (after the repo-root path fix-up)
    TargetFormat,
    WeightBridge,
    build_reshard_plan,
)
from megatron_adapters.model import ModelShape  # noqa: E402

SHAPES = {
    # Qwen2.5-1.5B: tied embeddings, GQA 12/2 (qkv bias: the qwen2 family).
    "1.5b": ModelShape("qwen2", 1536, 28, 12, 2, 128, 8960, 151936, True),
    # Llama-3-8B: untied, GQA 32/8.
    "8b": ModelShape("llama", 4096, 32, 32, 8, 128, 14336, 128256, False),
    "tiny": ModelShape("llama", 64, 2, 8, 2, 8, 128, 1000, False),
}


def _init_distributed(device: torch.device) -> None:
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def copy_bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes read + written per second by one large device-to-device copy."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    sync_device(device)
    start = time.perf_counter()
    reps = 5
    for _ in range(reps):
        b.copy_(a)
    sync_device(device)
    return 2 * nbytes * reps / (time.perf_counter() - start)


def sync_device(device: torch.device) -> None:
    """Wait for the device's queued work (timing boundaries); nothing to wait for on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run(args: argparse.Namespace) -> dict:
    """Build synthetic training shards for this rank, reshard ``--iters`` times, return timings."""
    device = (
        torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if args.device == "cuda" else torch.device("cpu")
    )
    if device.type == "cuda":
        torch.cuda.set_device(device)
    _init_distributed(device)
    world = dist.get_world_size()
    shape, dtype = SHAPES[args.shape], torch_dtype(args.dtype)
    ranks = tuple(range(world))
    dp = world // (args.train_tp * args.train_pp)
    plan = build_reshard_plan(RoleMesh("actor", ranks, ParallelDims(args.train_tp, args.train_pp, dp)),
                              RoleMesh("rollout", ranks, ParallelDims(args.gen_tp, 1, world // args.gen_tp)))
    target = TargetFormat.VLLM if args.target == "vllm" else TargetFormat.MEGATRON
    bridge = WeightBridge(plan, shape, target, dtype=dtype, bucket_bytes=args.bucket_mb << 20, device=device)
    rank = dist.get_rank()
    src = {
        t.entry.mcore: torch.randn(
            t.shard_shape(shape, bridge.train_geometry, plan.train.coords(rank)[0]), device=device
        ).to(dtype)
        for x, t in enumerate(bridge.tensors)
        if bridge.schedule.holds(rank, x)
    }
    dst = bridge.allocate_targets()
    src_bytes = sum(t.numel() * t.element_size() for t in src.values())
    dst_bytes = sum(t.numel() * t.element_size() for t in dst.values())
    bridge.reshard(src, dst)  # warm-up
    times, received = [], 0
    for _ in range(args.iters):
        dist.barrier()
        _, stats = bridge.reshard(src, dst)
        times.append(stats.seconds)
        received = stats.bytes_received
    bandwidth = copy_bandwidth(device, min(2 << 30, max(dst_bytes, 1 << 20)))
    best = min(times)
    floor_s = (src_bytes + dst_bytes) / bandwidth
    nominal_floor_s = (src_bytes + dst_bytes) / (args.nominal_tbps * 1e12)
    result = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "shape": args.shape,
        "layout": f"TP_t={args.train_tp} PP_t={args.train_pp} -> TP_g={args.gen_tp} ({args.target})",
        "world": world,
        "dtype": args.dtype,
        "bucket_mb": args.bucket_mb,
        "buckets": len(bridge.program),
        "model_gb_per_rank": dst_bytes / 1e9,
        "seconds_best": best,
        "seconds_median": sorted(times)[len(times) // 2],
        "gb_per_s_read_write": (src_bytes + dst_bytes) / best / 1e9,
        "bytes_received_per_rank": received,
        "copy_bandwidth_gb_per_s": bandwidth / 1e9,
        "floor_seconds": floor_s,
        "vs_floor": best / floor_s,
        "nominal_floor_seconds": nominal_floor_s,
        "vs_nominal_floor": best / nominal_floor_s,
    }
    dist.destroy_process_group()
    return result


def _report(result: dict) -> str:
    rows = "\n".join(f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in result.items())
    title = f"# Reshard benchmark {result['date']}: {result['shape']}, {result['layout']}"
    return f"{title}\n\n| metric | value |\n|---|---|\n{rows}\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="1.5b")
    p.add_argument("--train-tp", type=int, default=1)
    p.add_argument("--train-pp", type=int, default=1)
    p.add_argument("--gen-tp", type=int, default=1)
    p.add_argument("--target", choices=["vllm", "native"], default="vllm")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--bucket-mb", type=int, default=512)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--nominal-tbps", type=float, default=4.3, help="nominal device copy bandwidth (H200: ~4.3)")
    p.add_argument("--cpu-smoke", action="store_true", help="tiny shape on CPU, 2 iterations")
    p.add_argument("--out", type=Path, help="write a markdown report into this directory")
    args = p.parse_args(argv)
    if args.cpu_smoke:
        args.shape, args.device, args.iters, args.dtype = "tiny", "cpu", 2, "fp32"
    result = run(args)
    if int(os.environ.get("RANK", 0)) == 0:
        print(json.dumps(result))
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            name = (
                f"reshard_{args.shape}_{args.target}_t{args.train_tp}p{args.train_pp}g{args.gen_tp}_{result['date']}.md"
            )
            (args.out / name).write_text(_report(result))


if __name__ == "__main__":
    main()
