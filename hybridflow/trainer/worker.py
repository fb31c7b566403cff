"""What each rank runs: join torch.distributed, switch megatron-core to CPU where there is no GPU, train."""

from __future__ import annotations

import torch

from hybridflow.config import load_experiment
from hybridflow.launch import init_distributed
from hybridflow.noise import quiet_known_noise
from hybridflow.placement import plan_placement
from hybridflow.trainer.loop import train
from megatron_adapters.cpu_backend import enable_cpu_backend


def worker_main(experiment: str | None, overrides: list[str]) -> dict[str, float]:
    """Entry point of one rank (started by the local launcher, torchrun or srun)."""
    cfg = load_experiment(experiment, overrides)
    plan = plan_placement(cfg)
    init_distributed(cfg.distributed)
    if enable_cpu_backend():
        # CPU ranks share the machine's cores; one thread each avoids oversubscription and keeps
        # reductions in a fixed order (bitwise-reproducible resume).
        torch.set_num_threads(1)
    quiet_known_noise()  # megatron/torch repeats: once, as one line, on rank 0
    return train(cfg, plan)
