"""The `slurm:` settings of a rendered sbatch script (everything the plan does not decide)."""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.errors import UserError


@dataclass
class SlurmConfig:
    """Job settings for `python -m hybridflow.sbatch`. Nodes and GPUs per node come from the plan
    (`cluster.nodes`, `cluster.gpus_per_node`), not from here.

    launcher: "torchrun" starts one Slurm task per node running torchrun (c10d rendezvous on the first node);
      "srun" starts one Slurm task per rank directly.
    command: what each rank runs after the Python interpreter; None = `-m hybridflow.run <the overrides>`.
    python: the interpreter on the compute nodes; None = the one rendering the script.
    workdir: the job's working directory; None = the directory the script is rendered from.
    setup: shell lines run before launching (`module load ...`, `source venv/bin/activate`).
    extra_sbatch: further `#SBATCH` options, e.g. ["--constraint=h100", "--reservation=rl"].
    nccl_socket_ifname / nccl_ib_hca: exported when set (see the comments in the rendered script).
    """

    time: str = "04:00:00"
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    job_name: str | None = None  # None = the experiment's name
    launcher: str = "torchrun"  # "torchrun" | "srun"
    cpus_per_task: int | None = None  # torchrun: CPUs of the node's one task; srun: CPUs per rank
    mem: str | None = "0"  # "0" = all of each node's memory
    exclusive: bool = True
    output: str = "slurm-%x-%j.out"
    workdir: str | None = None
    python: str | None = None
    command: str | None = None
    setup: list[str] = field(default_factory=list)
    extra_sbatch: list[str] = field(default_factory=list)
    master_port: int | None = None  # None = distributed.master_port
    nccl_socket_ifname: str | None = None
    nccl_ib_hca: str | None = None

    def __post_init__(self) -> None:
        if self.launcher not in ("torchrun", "srun"):
            raise UserError(f"slurm.launcher: {self.launcher!r} is not a launcher; set torchrun or srun")
        for option in self.extra_sbatch:
            if not option.startswith("--"):
                raise UserError(f"slurm.extra_sbatch: {option!r} is not an sbatch option; "
                                "write it as --key=value")
