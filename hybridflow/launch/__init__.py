"""Starting ranks: local launch through torch's elastic agent, the Slurm/torchrun environment, sbatch scripts.

A worker calls `init_distributed(dist_cfg)`; the run CLI calls `detect_launcher()` to know whether it is
already under a launcher and `launch_local(plan, ...)` when it is not.
"""

from hybridflow.launch.environment import (
    LauncherEnv,
    check_node_mapping,
    detect_launcher,
    slurm_hostnames,
    worker_env,
)
from hybridflow.launch.local import (
    LaunchError,
    LaunchInterrupted,
    check_store_address,
    launch_local,
    launch_ranks,
)
from hybridflow.launch.ports import free_port, port_is_free
from hybridflow.launch.process_group import init_distributed, resolve_backend

__all__ = [
    "LaunchError",
    "LaunchInterrupted",
    "LauncherEnv",
    "check_node_mapping",
    "check_store_address",
    "detect_launcher",
    "free_port",
    "init_distributed",
    "launch_local",
    "launch_ranks",
    "port_is_free",
    "resolve_backend",
    "slurm_hostnames",
    "worker_env",
]
