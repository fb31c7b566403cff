"""How much device memory NCCL communicators take outside torch's caching allocator, on one GPU.

    python -m benchmarks.nccl_group_memory [--groups 36] [--json OUT]

A hybridflow run creates 12 process groups per role (megatron_adapters.process_groups) and binds the default group
to its GPU (`init_process_group(device_id=...)`), which makes torch create every later group's NCCL communicator
at once rather than at its first collective. Each variant runs in a fresh one-rank process and prints the device
memory the driver reports (used) beside torch's reserved memory after: the CUDA context, init_process_group, one
all-reduce on the default group, the groups, one all-reduce on each group (per_group_mib: the last less the
all-reduce on the default group, per group). Variants: eager (device_id bound, hybridflow's way), lazy (not bound), and
eager under NCCL environment settings that bear on per-communicator buffers.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys

from hybridflow.units import GIB

VARIANTS = {  # name -> (bind device_id, extra environment)
    "eager": (True, {}),
    "lazy": (False, {}),
    "eager_share_resources": (True, {"NCCL_COMM_SPLIT_SHARE_RESOURCES": "1"}),
    "eager_no_cumem": (True, {"NCCL_CUMEM_ENABLE": "0"}),
    "eager_no_nvls": (True, {"NCCL_NVLS_ENABLE": "0"}),
}


def measure(groups: int, bind: bool) -> dict:
    """One rank: the memory after each stage (GiB), in this process."""
    import torch
    import torch.distributed as dist

    def used() -> dict:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        return {"used": round((total - free) / GIB, 3), "reserved": round(torch.cuda.memory_reserved() / GIB, 3)}

    torch.cuda.set_device(0)
    torch.zeros(1, device="cuda")
    out = {"context": used(), "nccl": ".".join(map(str, torch.cuda.nccl.version()))}
    dist.init_process_group("nccl", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0) if bind else None)
    out["init_process_group"] = used()
    x = torch.ones(1, device="cuda")
    dist.all_reduce(x)
    out["world_all_reduce"] = used()  # the default group's communicator exists in both variants from here
    made = [dist.new_group([0]) for _ in range(groups)]
    out["groups"] = used()
    for g in made:
        dist.all_reduce(x, group=g)
    out["group_all_reduces"] = used()
    out["per_group_mib"] = round((out["group_all_reduces"]["used"] - out["world_all_reduce"]["used"]) * 1024
                                 / max(groups, 1), 1)
    dist.destroy_process_group()
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=36, help="groups to create (hybridflow: 12 per role)")
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--json", help="write every variant's figures here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.groups, VARIANTS[args.child][0])), flush=True)
        return
    results = {}
    for name in args.variants:
        env = {**os.environ, **VARIANTS[name][1], "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        done = subprocess.run([sys.executable, "-m", "benchmarks.nccl_group_memory", "--groups", str(args.groups),
                               "--child", name], env=env, capture_output=True, text=True, timeout=300)
        if done.returncode:
            results[name] = {"error": done.stderr.strip().splitlines()[-1:]}
        else:
            results[name] = json.loads(done.stdout.strip().splitlines()[-1])
        print(name, json.dumps(results[name]), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"groups": args.groups, "variants": results}, f, indent=1)


if __name__ == "__main__":
    main()
