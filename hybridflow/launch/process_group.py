"""Join the job's default process group from inside a worker: gloo on CPU, NCCL on GPUs, with a timeout."""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hybridflow.errors import UserError
from hybridflow.launch.environment import LauncherEnv, worker_env
from hybridflow.launch.lifeline import stay_with_launcher

if TYPE_CHECKING:
    from hybridflow.config import DistributedConfig


def resolve_backend(backend: str, cuda_available: bool | None = None) -> str:
    """`distributed.backend` -> the torch.distributed backend: auto = nccl with GPUs, gloo without."""
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    if backend == "auto":
        return "nccl" if cuda else "gloo"
    if backend == "nccl" and not cuda:
        raise UserError("distributed.backend: nccl needs CUDA GPUs and none are visible; "
                        "set distributed.backend=gloo (or auto)")
    if backend not in ("nccl", "gloo"):
        raise UserError(f"distributed.backend: {backend!r} is not supported; set auto, nccl or gloo")
    return backend


def init_distributed(dist_cfg: DistributedConfig, launcher: LauncherEnv | None = None) -> LauncherEnv:
    """Initialise torch.distributed's default group for this worker and return its launcher environment.

    Every collective on the default group (and on groups created later without their own timeout) fails
    after `dist_cfg.timeout_s` instead of hanging: that is what makes all ranks stop when a peer on another
    node dies (on one node the elastic agent already kills the survivors). A rank of a local launch also ends
    when the launcher dies (`lifeline`; a callable rank follows it from its first line already). Idempotent.
    """
    stay_with_launcher()
    launcher = launcher or worker_env(default_port=dist_cfg.master_port)
    backend = resolve_backend(dist_cfg.backend)
    launcher_rank = os.environ.get("RANK")
    if launcher_rank is not None and int(launcher_rank) != launcher.rank:
        # torchrun's own messages (its failure summary) use its numbering: say once how they relate.
        print(f"hybridflow: rank {launcher.rank} (node {launcher.node_rank} of Slurm's node list) is "
              f"torchrun rank {launcher_rank}", file=sys.stderr, flush=True)
    # Libraries that read the environment themselves (megatron-core, vLLM's external_launcher) must see the
    # same rank as the group, including the Slurm node-order renumbering done in `environment`.
    os.environ.update({
        "RANK": str(launcher.rank), "WORLD_SIZE": str(launcher.world_size),
        "LOCAL_RANK": str(launcher.local_rank), "LOCAL_WORLD_SIZE": str(launcher.local_world_size),
        "MASTER_ADDR": launcher.master_addr, "MASTER_PORT": str(launcher.master_port),
    })
    if dist.is_initialized():
        return launcher
    device_id = None
    if backend == "nccl":
        torch.cuda.set_device(launcher.local_rank)
        device_id = torch.device("cuda", launcher.local_rank)  # binds the communicator to this GPU eagerly
    dist.init_process_group(backend=backend, init_method="env://", rank=launcher.rank,
                            world_size=launcher.world_size, timeout=timedelta(seconds=dist_cfg.timeout_s),
                            device_id=device_id)
    return launcher
