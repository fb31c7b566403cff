"""Render an sbatch script: one torchrun per node (c10d rendezvous on the first node) or one srun task per
rank.

The same renderer writes the ready-to-submit scripts of `python -m hybridflow.sbatch` and the generic
templates checked in under scripts/slurm/ (`builtin_templates`), so the two cannot drift apart.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hybridflow.launch.slurm_config import SlurmConfig


@dataclass(frozen=True)
class SbatchLayout:
    """What the script asks Slurm for. nodes=None leaves the count to `sbatch --nodes=N`."""

    nodes: int | None
    gpus_per_node: int
    request_gpus: bool = True  # False for CPU "devices" (cluster.gpu_type=cpu)
    node_roles: tuple[str, ...] = ()  # one header line per plan node, e.g. "ranks 0-7: actor, rollout"


def layout_from_plan(plan, request_gpus: bool) -> SbatchLayout:
    """The layout of a `hybridflow.placement.Plan`, with which roles each node holds for the header."""
    roles_of_rank: Mapping[int, Sequence[str]] = getattr(plan, "rank_roles", {}) or {}
    lines = []
    for node in range(plan.nodes):
        ranks = [g.rank for g in plan.gpus if g.node == node]
        roles = sorted({r for rank in ranks for r in roles_of_rank.get(rank, ())})
        lines.append(f"ranks {ranks[0]}-{ranks[-1]}" + (f": {', '.join(roles)}" if roles else ""))
    return SbatchLayout(plan.nodes, plan.gpus_per_node, request_gpus, tuple(lines))


NCCL_BLOCK = """\
# ---- NCCL / CUDA settings (the commented ones depend on your fabric: uncomment and adapt) ----------------
# Megatron overlaps TP/SP communication with compute only when kernels are queued in order on one connection.
export CUDA_DEVICE_MAX_CONNECTIONS=1
# Which network interface NCCL (and gloo) bootstrap over: the one the nodes reach each other on. Without
# it NCCL may pick docker0 or a management NIC and hang at init. List them with `ip -br addr`.
{ifname}
# InfiniBand / RoCE: the HCAs NCCL may use (`ibv_devinfo -l`), and for RoCE the GID index (often 3).
{ib_hca}
# export NCCL_IB_GID_INDEX=3
# No InfiniBand at all (Ethernet-only clusters): make NCCL use sockets instead of failing on IB init.
# export NCCL_IB_DISABLE=1
# Print NCCL's choice of transport per ring at init (INFO), or only problems (WARN).
export NCCL_DEBUG=${{NCCL_DEBUG:-WARN}}
# A failed or timed-out collective (distributed.timeout_s) aborts the communicator and ends the process
# instead of hanging: that is how a dead rank on one node stops the ranks on the others (torchrun's default).
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${{TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}}
"""

RENDEZVOUS_BLOCK = """\
# ---- rendezvous on the first node of the allocation ------------------------------------------------------
# Plan node i is the i-th host of this list; hybridflow numbers ranks in this order.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
# NodeAddr is the address slurmctld itself uses to reach the node (it may differ from the host name).
head_addr=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2 || true)
export MASTER_ADDR="${{MASTER_ADDR:-${{head_addr:-$head_node}}}}"
# Must be free on the first node; change it (or distributed.master_port) when two jobs share a node.
export MASTER_PORT="${{MASTER_PORT:-{port}}}"
"""


def _sbatch_lines(slurm: SlurmConfig, layout: SbatchLayout, job_name: str) -> list[str]:
    tasks = 1 if slurm.launcher == "torchrun" else layout.gpus_per_node
    opts = [f"--job-name={job_name}"]
    if layout.nodes is not None:
        opts.append(f"--nodes={layout.nodes}")
    opts.append(f"--ntasks-per-node={tasks}")
    if layout.request_gpus:
        opts.append(f"--gpus-per-node={layout.gpus_per_node}")
    for key, value in (("cpus-per-task", slurm.cpus_per_task), ("mem", slurm.mem), ("time", slurm.time),
                       ("partition", slurm.partition), ("account", slurm.account), ("qos", slurm.qos),
                       ("output", slurm.output), ("chdir", slurm.workdir)):
        if value is not None:
            opts.append(f"--{key}={value}")
    if slurm.exclusive:
        opts.append("--exclusive")
    opts.extend(slurm.extra_sbatch)
    return [f"#SBATCH {o}" for o in opts]


def _launch_lines(slurm: SlurmConfig, layout: SbatchLayout, command: str) -> list[str]:
    if slurm.launcher == "torchrun":
        return [
            "# One task per node runs torchrun; --kill-on-bad-exit stops every node when one torchrun fails.",
            "# c10d numbers nodes by sorted host name; hybridflow renumbers ranks into node-list order and",
            "# prints 'hybridflow: rank R ... is torchrun rank T' where torchrun's summaries would differ.",
            'srun --ntasks-per-node=1 --kill-on-bad-exit=1 \\',
            '  "$PYTHON" -m torch.distributed.run \\',
            f'    --nnodes="$SLURM_NNODES" --nproc-per-node={layout.gpus_per_node} \\',
            '    --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT" \\',
            '    --rdzv-id="$SLURM_JOB_ID" --max-restarts=0 \\',
            '    --log-dir="$LOG_DIR" --redirects=3 --tee=3 \\',
            f'    {command}',
        ]
    return [
        "# One task per rank: block distribution puts ranks [i*G, (i+1)*G) on node i, as the plan does.",
        f'srun --ntasks-per-node={layout.gpus_per_node} --distribution=block --kill-on-bad-exit=1 --label \\',
        f'  "$PYTHON" -u {command}',
    ]


def render_sbatch(layout: SbatchLayout, slurm: SlurmConfig, *, job_name: str, command: str, master_port: int,
                  python: str, header: Sequence[str] = ()) -> str:
    """The full script text. `command` follows the interpreter (e.g. `-m hybridflow.run +experiment=x`);
    the script's own arguments are appended, so `sbatch script.sbatch key=value` adds overrides."""
    nodes = f"{layout.nodes} node(s)" if layout.nodes is not None else "N nodes (sbatch --nodes=N)"
    device = "GPUs" if layout.request_gpus else "CPU processes"
    lines = ["#!/bin/bash", *(f"# {h}" for h in header),
             f"# Layout: {nodes} x {layout.gpus_per_node} {device}; launcher: {slurm.launcher}."]
    lines += [f"#   node {i} (host {i + 1} of the node list): {roles}"
              for i, roles in enumerate(layout.node_roles)]
    lines += _sbatch_lines(slurm, layout, job_name)
    lines += ["", "set -euo pipefail", ""]
    ifname = (f"export NCCL_SOCKET_IFNAME={shlex.quote(slurm.nccl_socket_ifname)}\nexport GLOO_SOCKET_IFNAME="
              f"{shlex.quote(slurm.nccl_socket_ifname)}" if slurm.nccl_socket_ifname
              else "# export NCCL_SOCKET_IFNAME=ib0  GLOO_SOCKET_IFNAME=ib0")
    ib_hca = (f"export NCCL_IB_HCA={shlex.quote(slurm.nccl_ib_hca)}" if slurm.nccl_ib_hca
              else "# export NCCL_IB_HCA=mlx5_0,mlx5_1,mlx5_2,mlx5_3")
    if layout.request_gpus:
        lines.append(NCCL_BLOCK.format(ifname=ifname, ib_hca=ib_hca))
    lines.append(RENDEZVOUS_BLOCK.format(port=master_port))
    # Setup first: it may load modules, activate an environment or export PYTHON / HYBRIDFLOW_LOG_DIR.
    lines += [*slurm.setup, f'PYTHON="${{PYTHON:-{python}}}"',
              'LOG_DIR="${HYBRIDFLOW_LOG_DIR:-runs/slurm-$SLURM_JOB_ID}"', ""]
    rank_command = f'{command} "$@"'
    if command.split()[:2] == ["-m", "hybridflow.run"]:
        lines += ["# Resolve and plan once, here, into $PLAN_FILE (on a filesystem every node sees): each rank reads",
                  "# the config and the plan from it and composes, converts and plans nothing itself.",
                  'PLAN_FILE="${HYBRIDFLOW_PLAN_FILE:-$LOG_DIR/plan.json}"',
                  f'"$PYTHON" -u {command} --plan-only --plan "$PLAN_FILE" "$@"', ""]
        rank_command = '-m hybridflow.run --plan "$PLAN_FILE"'
    lines += _launch_lines(slurm, layout, rank_command)
    return "\n".join(lines) + "\n"


TEMPLATE_HEADER = ("hybridflow sbatch template. Submit: sbatch {name} +experiment=NAME [overrides]",
                   "Or render one for your plan: python -m hybridflow.sbatch +experiment=NAME slurm.time=...")


def builtin_templates() -> dict[str, str]:
    """The scripts under scripts/slurm/: file name -> text (regenerate with `python -m hybridflow.sbatch
    --write-templates scripts/slurm`)."""
    variants = {
        "1node_8gpu.sbatch": (SbatchLayout(1, 8), "torchrun"),
        "2node_8gpu.sbatch": (SbatchLayout(2, 8), "torchrun"),
        "multinode_8gpu.sbatch": (SbatchLayout(None, 8), "torchrun"),
        "multinode_8gpu_srun.sbatch": (SbatchLayout(None, 8), "srun"),
    }
    out = {}
    for name, (layout, launcher) in variants.items():
        slurm = SlurmConfig(launcher=launcher)
        header = [h.format(name=f"scripts/slurm/{name}") for h in TEMPLATE_HEADER]
        out[name] = render_sbatch(layout, slurm, job_name="hybridflow", command="-m hybridflow.run",
                                  master_port=29500, python="python", header=header)
    return out
