"""What each rank runs: read the launcher's plan.json, join torch.distributed, switch megatron-core to CPU where
there is no GPU, train."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import transformers

from hybridflow.launch import init_distributed
from hybridflow.launch.known_warnings import quiet_known_noise
from hybridflow.trainer.loop import train
from hybridflow.trainer.plan_file import read_run
from megatron_adapters.cpu_backend import enable_cpu_backend


def rank_main(plan_file: str) -> dict[str, float]:
    """Entry point of one rank (started by the local launcher, torchrun or srun): the resolved config and the
    plan come from `plan_file` (plan.json); the rank composes, converts and plans nothing itself."""
    cfg, plan = read_run(Path(plan_file))  # it imports the user's modules (cfg.imports)
    # First, so that nothing this rank warns lands in its parent's file (a forked rank inherits its state):
    # megatron/torch repeats once, as one line, on rank 0; full text in this rank's logs/warnings_rank<R>.txt.
    quiet_known_noise(log_dir=Path(cfg.trainer.output_dir) / "logs")
    # The run's one progress bar is its RL steps: transformers' bars (writing the built-in task's random
    # checkpoint, the final HF export) would stack up above it.
    transformers.utils.logging.disable_progress_bar()
    init_distributed(cfg.distributed)
    if enable_cpu_backend():
        # CPU ranks share the machine's cores; one thread each avoids oversubscription and keeps
        # reductions in a fixed order (bitwise-reproducible resume).
        torch.set_num_threads(1)
    metrics = train(cfg, plan)
    # Torn down here, while the interpreter is whole (torch's advice): left to the interpreter's exit, the
    # communicators' destructors ran among modules being unloaded, and 2 of 3 vLLM runs on an H100 (stop 56)
    # were killed by SIGSEGV after their last step, their outputs written, turning a finished run into a failure.
    dist.destroy_process_group()
    return metrics
