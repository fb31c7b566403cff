"""Who started this process: torchrun (or our own local launch), an `srun` task per rank, or nobody.

A worker reads its place in the job from the environment its launcher set. Two launchers are supported,
both standard: torch's elastic agent (torchrun, `hybridflow.launch.launch_local`) sets RANK/WORLD_SIZE/
LOCAL_RANK/MASTER_ADDR/MASTER_PORT; an `srun` step with one task per rank sets SLURM_PROCID/SLURM_NTASKS/
SLURM_LOCALID/SLURM_NODEID and the node list.

Node order: the plan's node i is the i-th host of `scontrol show hostnames $SLURM_JOB_NODELIST`. srun's block
distribution gives node i the ranks [i*L, (i+1)*L). torchrun's c10d rendezvous instead numbers nodes by
sorted host name (node10 before node2), so under "one torchrun per node" the global rank is recomputed from
SLURM_NODEID; torch.distributed only needs ranks to be unique, so this is safe and keeps the plan's node
mapping true.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

LauncherKind = Literal["torchrun", "slurm"]


@dataclass(frozen=True)
class LauncherEnv:
    """This process's place in the job, as its launcher described it."""

    launcher: LauncherKind
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nodes: int
    master_addr: str
    master_port: int


def slurm_hostnames(nodelist: str) -> list[str]:
    """Expand a Slurm node list (`gpu[01-03],big7`) with `scontrol show hostnames`, in Slurm's order."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        raise RuntimeError(f"scontrol not found on PATH: cannot expand SLURM node list {nodelist!r}; "
                           "set MASTER_ADDR to the first node's address instead")
    out = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True,
                         timeout=30, check=True)
    return out.stdout.split()


def _tasks_on_first_node(tasks_per_node: str) -> int:
    """First count of Slurm's compressed per-node task list, e.g. '8(x2),4' -> 8."""
    match = re.match(r"\s*(\d+)", tasks_per_node)
    if match is None:
        raise ValueError(f"SLURM_STEP_TASKS_PER_NODE: cannot parse {tasks_per_node!r}")
    return int(match.group(1))


def _from_torchrun(env: Mapping[str, str]) -> LauncherEnv:
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", "0"))
    local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
    nodes = int(env.get("GROUP_WORLD_SIZE", str(max(1, world // max(local_world, 1)))))
    node_rank = int(env.get("GROUP_RANK", str(rank // max(local_world, 1))))
    one_agent_per_slurm_node = (
        "SLURM_NODEID" in env and "SLURM_STEP_ID" in env
        and env.get("SLURM_NTASKS") == env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES"))
        and int(env.get("SLURM_NTASKS", "0")) == nodes
    )
    if one_agent_per_slurm_node:
        # Renumber so that node i of the plan is the i-th host of Slurm's node list (see module docstring).
        node_rank = int(env["SLURM_NODEID"])
        rank = node_rank * local_world + local_rank
    return LauncherEnv("torchrun", rank, world, local_rank, local_world, node_rank, nodes,
                       env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500")))


def _from_srun(env: Mapping[str, str], default_port: int) -> LauncherEnv:
    world = int(env.get("SLURM_STEP_NUM_TASKS", env["SLURM_NTASKS"]))
    nodes = int(env.get("SLURM_STEP_NUM_NODES", env.get("SLURM_NNODES", "1")))
    per_node = env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", str(world)))
    master_addr = env.get("MASTER_ADDR")
    if not master_addr:
        nodelist = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))
        master_addr = slurm_hostnames(nodelist)[0] if nodelist else "127.0.0.1"
    return LauncherEnv("slurm", int(env["SLURM_PROCID"]), world, int(env.get("SLURM_LOCALID", "0")),
                       _tasks_on_first_node(per_node), int(env.get("SLURM_NODEID", "0")), nodes,
                       master_addr, int(env.get("MASTER_PORT", str(default_port))))


def detect_launcher(env: Mapping[str, str] | None = None, default_port: int = 29500) -> LauncherEnv | None:
    """The launcher environment of this process, or None when no launcher started it.

    torchrun-style variables win over Slurm ones (torchrun inside srun sets both). A Slurm batch script
    itself is not a launcher: only an `srun` step (SLURM_STEP_ID set) counts, so running
    `python -m hybridflow.run` directly in a batch script plans and launches locally instead of waiting for
    ranks that will never come.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        return _from_torchrun(env)
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and "SLURM_NTASKS" in env:
        return _from_srun(env, default_port)
    return None


def worker_env(env: Mapping[str, str] | None = None, default_port: int = 29500) -> LauncherEnv:
    """Like `detect_launcher`, but a worker must have a launcher: raise with the fix otherwise."""
    found = detect_launcher(env, default_port)
    if found is None:
        raise RuntimeError("no launcher environment (RANK/WORLD_SIZE or an srun step) in this process; start "
                           "workers with `python -m hybridflow.run`, torchrun, or srun")
    return found


def check_node_mapping(plan_node_of_rank: Mapping[int, int] | list[int], launcher: LauncherEnv) -> None:
    """Fail fast when the launcher put this rank on another node than the plan did.

    `plan_node_of_rank[r]` is plan.gpus[r].node. A mismatch means the job's layout (tasks per node, nodes)
    differs from the plan's, and cross-node groups would silently land on slow links.
    """
    expected = plan_node_of_rank[launcher.rank]
    if expected != launcher.node_rank:
        per_node = launcher.world_size // max(launcher.nodes, 1)
        raise RuntimeError(f"rank {launcher.rank} runs on node {launcher.node_rank} of the job but the plan "
                           f"put it on node {expected}; start {per_node} ranks per node, nodes in Slurm's "
                           "node-list order")
