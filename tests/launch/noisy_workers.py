"""A worker module that warns at import as megatron-core does (a known warning:
hybridflow/launch/known_warnings.py) and a worker that draws a progress bar on rank 0, for test_console.py."""

from __future__ import annotations

import sys
import warnings

from hybridflow.launch import init_distributed
from tests.launch.launch_workers import DistCfg

warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=1)


def prints_progress(port: int) -> None:
    launcher = init_distributed(DistCfg(master_port=int(port)))
    print(f"rank {launcher.rank} says hi", flush=True)
    if launcher.rank == 0:
        for step in (1, 2):  # what tqdm writes: the line redrawn after a carriage return
            sys.stderr.write(f"\rsteps {step}/2")
            sys.stderr.flush()
        sys.stderr.write("\n")
