"""Small distributed workers for the launcher tests: all_reduce, a rank that dies, a rank that hangs.

Usable as callables (`launch_local(plan, all_reduce, ...)`) and as a script under torchrun/srun:
`python tests/launch/launch_workers.py all_reduce OUT_DIR [PORT]`.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a script: make the checkout importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import psutil  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from hybridflow.launch import init_distributed  # noqa: E402

# The process that imported this module: a rank forked from a fork server that preloaded it inherits the
# server's pid here (the launcher's preload worked); a rank that imported it itself has its own pid.
IMPORTED_BY_PID = os.getpid()


@dataclass
class DistCfg:
    """Stand-in for hybridflow.config.DistributedConfig (same fields)."""

    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    # Read when built, not at import: the CPU scenarios force gloo through the environment.
    backend: str = field(default_factory=lambda: os.environ.get("HYBRIDFLOW_TEST_BACKEND", "auto"))
    timeout_s: int = 60


def _record(out_dir: str, launcher, **extra) -> dict:
    """Write this rank's facts to OUT_DIR/rank<R>.json (the tests read them back)."""
    info = {"rank": launcher.rank, "world_size": launcher.world_size, "local_rank": launcher.local_rank,
            "node_rank": launcher.node_rank, "nodes": launcher.nodes, "launcher": launcher.launcher,
            "pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "env_rank": os.environ.get("RANK"),
            "module_preloaded": IMPORTED_BY_PID != os.getpid(), **extra}
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    Path(out_dir, f"rank{launcher.rank}.json").write_text(json.dumps(info))
    return info


def all_reduce(out_dir: str, port: int = 29500, timeout_s: int = 60) -> dict:
    """Sum rank+1 over the world; every rank records the result."""
    launcher = init_distributed(DistCfg(master_port=int(port), timeout_s=int(timeout_s)))
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    value = torch.tensor([float(launcher.rank + 1)], device=device)
    dist.all_reduce(value)
    # Also gather each rank's node so the test can check the plan's node order end to end.
    nodes = [None] * launcher.world_size
    dist.all_gather_object(nodes, (launcher.rank, launcher.node_rank))
    # Every socket of this machine listening on the store's port (the launcher's store, while ranks run).
    listeners = sorted({c.laddr.ip for c in psutil.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN and c.laddr.port == int(port)})
    info = _record(out_dir, launcher, sum=value.item(), nodes_by_rank=sorted(nodes), store_listeners=listeners,
                   backend=dist.get_backend(), device=device.index if device is not None else None)
    print(f"ALLREDUCE_OK rank={launcher.rank} sum={value.item():g}", flush=True)
    dist.destroy_process_group()
    return info


def one_rank_dies(out_dir: str, port: int, timeout_s: int, victim: int, how: str) -> dict:
    """All ranks join; then `victim` exits(1) or SIGKILLs itself while the others wait in an all_reduce."""
    launcher = init_distributed(DistCfg(master_port=int(port), timeout_s=int(timeout_s)))
    info = _record(out_dir, launcher)
    dist.barrier()
    if launcher.rank == int(victim):
        print(f"rank {launcher.rank} is about to fail on purpose ({how})", file=sys.stderr, flush=True)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        sys.exit(1)
    dist.all_reduce(torch.ones(1))  # cannot complete: the victim never joins
    time.sleep(3600)  # only reached if the collective wrongly returned; the agent must stop us
    return info


def one_rank_raises(out_dir: str, port: int, timeout_s: int, victim: int) -> dict:
    """`victim` raises a Python exception (torch's @record writes it to the rank's error file)."""
    launcher = init_distributed(DistCfg(master_port=int(port), timeout_s=int(timeout_s)))
    info = _record(out_dir, launcher)
    dist.barrier()
    if launcher.rank == int(victim):
        raise ValueError("bad batch on purpose")
    dist.all_reduce(torch.ones(1))
    time.sleep(3600)
    return info


def one_rank_hangs(out_dir: str, port: int, timeout_s: int, sleeper: int) -> dict:
    """`sleeper` never joins the collective: the others must fail after the collective timeout."""
    launcher = init_distributed(DistCfg(master_port=int(port), timeout_s=int(timeout_s)))
    info = _record(out_dir, launcher)
    if launcher.rank == int(sleeper):
        time.sleep(3600)
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1))
    except Exception as err:  # gloo raises on timeout
        _record(out_dir, launcher, timed_out_after_s=time.monotonic() - start, error=type(err).__name__)
        print(f"rank {launcher.rank} collective timed out: {err}", file=sys.stderr, flush=True)
        sys.exit(3)
    return info


class _EchoEngine:
    """The smallest engine a rank can host: holds nothing (weight_tensors matches an empty staging layout)."""

    def weight_tensors(self) -> dict:
        return {}


def _echo_engine(mesh) -> _EchoEngine:
    return _EchoEngine()


def ranks_with_engines(out_dir: str, port: int, timeout_s: int = 60) -> dict:
    """Every rank hosts an engine process (as a vLLM rollout rank does), records both pids, then waits forever:
    only the launcher's death (or the test) ends them."""
    from hybridflow.placement import ParallelDims, RoleMesh
    from tests.rollout.hosted_engine import start_hosted_engine

    launcher = init_distributed(DistCfg(master_port=int(port), timeout_s=int(timeout_s)))
    mesh = RoleMesh("rollout", tuple(range(launcher.world_size)), ParallelDims(1, 1, launcher.world_size))
    engine = start_hosted_engine(_echo_engine, (), mesh, [], torch.float32, torch.device("cpu"), int(timeout_s))
    info = _record(out_dir, launcher, engine_pid=engine.process.pid)
    time.sleep(3600)
    return info


if __name__ == "__main__":
    mode, *rest = sys.argv[1:]
    modes = {"all_reduce": all_reduce, "one_rank_dies": one_rank_dies, "one_rank_raises": one_rank_raises,
             "one_rank_hangs": one_rank_hangs}
    modes[mode](*rest)
