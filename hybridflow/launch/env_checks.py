"""What this machine has, against what hybridflow (and optionally one experiment's plan) needs.

Each check returns `Finding`s: what was found, and when it falls short, the requirement it violates and the
command that fixes it. Nothing here initialises a process group or allocates GPU memory.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import platform
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from hybridflow.engines import engine_names, get_engine
from hybridflow.launch.ports import free_port, port_is_free
from hybridflow.units import GIB

MIN_PYTHON = (3, 12)
MIN_TORCH = "2.6"
MEGATRON_CORE = "0.19.2"
# Minimum Linux driver per CUDA major version of the torch build (NVIDIA's CUDA release notes, table 3).
MIN_DRIVER = {12: "525.60.13", 13: "580.65.06"}
TORCH_CUDA_WHEEL = "pip install torch --index-url https://download.pytorch.org/whl/cu128"


@dataclass(frozen=True)
class Finding:
    """status: ok | info (not needed here) | warn (runs, but slower or with wrong estimates) | fail."""

    name: str
    value: str
    status: str = "ok"
    requirement: str = ""
    fix: str = ""


@dataclass(frozen=True)
class Needs:
    """What the experiment asks of the machine it starts on (a node's share of the plan)."""

    experiment: str | None = None
    gpus_per_node: int = 0  # 0: CPU processes stand in for GPUs
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None
    nodes: int = 1
    engine: str | None = None  # the rollout engine the plan runs (None: no experiment, every engine's package is info)
    master_port: int = 29500
    master_addr: str = "127.0.0.1"

    @classmethod
    def from_experiment(cls, cfg, plan) -> Needs:
        gpu = cfg.cluster.gpu_type != "cpu"
        return cls(cfg.name, plan.gpus_per_node if gpu else 0, cfg.cluster.gpu_type if gpu else None,
                   cfg.cluster.gpu_memory_gib if gpu else None, plan.nodes, plan.rollout_engine,
                   cfg.distributed.master_port, cfg.distributed.master_addr)


def _run(argv: list[str], timeout: float = 20) -> str | None:
    """stdout of a command, or None when it is absent or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_python() -> list[Finding]:
    found = platform.python_version()
    if sys.version_info[:2] >= MIN_PYTHON:
        return [Finding("python", f"{found} ({sys.executable})")]
    need = ".".join(map(str, MIN_PYTHON))
    return [Finding("python", found, "fail", f"Python >= {need} (setup.py python_requires)",
                    f"python{need} -m venv .venv && .venv/bin/pip install -e '.[test]'")]


def check_torch(needs: Needs) -> list[Finding]:
    import torch

    cuda = torch.version.cuda
    value = f"{torch.__version__} (CUDA build: {cuda or 'none, CPU-only wheel'})"
    if Version(torch.__version__.split("+")[0]) < Version(MIN_TORCH):
        return [Finding("torch", value, "fail", f"torch >= {MIN_TORCH}", f"pip install 'torch>={MIN_TORCH}'")]
    if needs.gpus_per_node and cuda is None:
        return [Finding("torch", value, "fail", "a CUDA build of torch for a GPU experiment", TORCH_CUDA_WHEEL)]
    return [Finding("torch", value)]


def _gpu_names() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def check_gpus(needs: Needs, names: list[str]) -> list[Finding]:
    import os

    import torch

    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if not names:
        why = "no CUDA device visible: torch.cuda.is_available() is False"
        why += f", CUDA_VISIBLE_DEVICES={hidden!r}" if hidden is not None else ""
        if not needs.gpus_per_node:
            return [Finding("gpus", f"none ({why}); CPU processes stand in for GPUs", "info")]
        return [Finding("gpus", f"none ({why})", "fail",
                        f"{needs.gpus_per_node} GPUs on this node (cluster.gpus_per_node={needs.gpus_per_node})",
                        "run on a GPU node (under Slurm: srun --gpus-per-node=N ...); check `nvidia-smi`")]
    counts = {n: names.count(n) for n in dict.fromkeys(names)}
    value = f"{len(names)}: " + ", ".join(f"{c} x {n}" for n, c in counts.items())
    findings = [Finding("gpus", value)]
    if needs.gpus_per_node > len(names):
        findings = [Finding("gpus", value, "fail", f"{needs.gpus_per_node} GPUs on this node "
                            f"(cluster.gpus_per_node={needs.gpus_per_node})",
                            f"set cluster.gpus_per_node={len(names)} or run on a larger node")]
    if needs.gpu_type and not all(needs.gpu_type.lower() in n.lower() for n in names):
        findings.append(Finding("gpu type", names[0], "warn", f"cluster.gpu_type={needs.gpu_type} (memory and "
                                "cost estimates use its figures)", "set cluster.gpu_type to this GPU's type"))
    if needs.gpu_memory_gib:
        have = min(torch.cuda.get_device_properties(i).total_memory for i in range(len(names))) / GIB
        if have < needs.gpu_memory_gib * 0.95:
            findings.append(Finding("gpu memory", f"{have:.0f} GiB", "fail",
                                    f"cluster.gpu_memory_gib={needs.gpu_memory_gib:g} per GPU",
                                    f"set cluster.gpu_memory_gib={have:.0f} and re-plan"))
    return findings


def check_driver(needs: Needs) -> list[Finding]:
    import torch

    out = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    if out is None:
        status = "fail" if needs.gpus_per_node else "info"
        return [Finding("driver", "nvidia-smi not found or failing", status,
                        "an NVIDIA driver for a GPU experiment" if needs.gpus_per_node else "",
                        "install the NVIDIA driver (nvidia-smi must work)" if needs.gpus_per_node else "")]
    driver = out.split()[0]
    cuda = torch.version.cuda
    minimum = MIN_DRIVER.get(int(cuda.split(".")[0])) if cuda else None
    if minimum and Version(driver) < Version(minimum):
        return [Finding("driver", driver, "fail", f"driver >= {minimum} for torch's CUDA {cuda}",
                        f"upgrade the driver, or use a torch built for an older CUDA: {TORCH_CUDA_WHEEL}")]
    return [Finding("driver", driver)]


def check_nccl(needs: Needs) -> list[Finding]:
    import torch
    import torch.distributed as dist

    if not dist.is_nccl_available():
        status = "fail" if needs.gpus_per_node else "info"
        return [Finding("nccl", "not in this torch build", status, "NCCL for GPU collectives" if status == "fail"
                        else "", TORCH_CUDA_WHEEL if status == "fail" else "")]
    version = ".".join(map(str, torch.cuda.nccl.version()))
    return [Finding("nccl", version)]


def nvlink_matrix(text: str) -> dict[tuple[int, int], str]:
    """GPU-to-GPU cells of `nvidia-smi topo -m` (e.g. NV18, PIX, SYS), keyed by (row GPU, column GPU)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", text)  # nvidia-smi underlines the header on a terminal-like stdout
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    gpu_cols = {i: int(h[3:]) for i, h in enumerate(lines[0]) if re.fullmatch(r"GPU\d+", h)}
    cells = {}
    for row in lines[1:]:
        if not re.fullmatch(r"GPU\d+", row[0]):
            continue  # NIC rows, the legend
        for col, gpu in gpu_cols.items():
            if col + 1 < len(row):  # the header has no row-label column: cells sit one to the right
                cells[(int(row[0][3:]), gpu)] = row[col + 1]
    return cells


def check_topology(needs: Needs) -> list[Finding]:
    out = _run(["nvidia-smi", "topo", "-m"])
    if out is None:
        return [Finding("nvlink", "nvidia-smi topo -m not available", "info")]
    cells = nvlink_matrix(out)
    slow = sorted((a, b, v) for (a, b), v in cells.items() if a < b and not v.startswith("NV"))
    gpus = len({a for a, _ in cells})
    if gpus < 2:
        return [Finding("nvlink", f"{gpus} GPU: no GPU pairs to link")]
    summary = f"{gpus} GPUs; " + ("all pairs on NVLink" if not slow else f"{len(slow)} pairs without NVLink")
    if slow and needs.gpus_per_node > 1:
        pairs = ", ".join(f"GPU{a}-GPU{b}={v}" for a, b, v in slow[:4])
        return [Finding("nvlink", summary, "warn", "NVLink between GPUs of one TP group (cluster."
                        "nvlink_domain_size)", f"set cluster.nvlink_domain_size to the NVLink island size "
                        f"({pairs})")]
    return [Finding("nvlink", summary)]


def check_packages(needs: Needs) -> list[Finding]:
    found = []
    mcore = _dist_version("megatron-core", "megatron_core")
    if mcore != MEGATRON_CORE:
        found.append(Finding("megatron-core", mcore or "missing", "fail", f"megatron-core=={MEGATRON_CORE}",
                             f"pip install megatron-core=={MEGATRON_CORE}"))
    else:
        found.append(Finding("megatron-core", mcore))
    te = _dist_version("transformer-engine", "transformer_engine", "transformer-engine-torch")
    if te is None and importlib.util.find_spec("transformer_engine") is not None:
        te = "installed (version unknown)"
    if te:
        found.append(Finding("transformer-engine", te))
    else:
        found.append(Finding("transformer-engine", "missing", "warn" if needs.gpus_per_node else "info",
                             "fused kernels for GPU training (optional: torch fallbacks are used)" if
                             needs.gpus_per_node else "", "pip install -e '.[te]'" if needs.gpus_per_node else ""))
    for name in engine_names():  # each engine's own package (its record's traits.package)
        need = get_engine(name).traits.package
        if need is None:
            continue
        version = _dist_version(need.distribution)
        if needs.engine == name and (version is None or Version(version) not in SpecifierSet(need.versions)):
            others = " or ".join(n for n in engine_names() if n != name)
            found.append(Finding(need.distribution, version or "missing", "fail",
                                 f"{need.distribution}{need.versions} for rollout.engine={name}",
                                 f"pip install -e '.[{need.extra}]' (or set rollout.engine={others})"))
        else:
            found.append(Finding(need.distribution, version or "missing", "ok" if version else "info"))
    return found


def check_port(needs: Needs) -> list[Finding]:
    """Bound as a local launch's store binds it (on master_addr); on a multi-node run, on every interface (this
    machine stands in for the first node, whose address may not be its own)."""
    host = needs.master_addr if needs.nodes == 1 else ""
    if port_is_free(needs.master_port, host):
        return [Finding("master port", f"{needs.master_port} free")]
    return [Finding("master port", f"{needs.master_port} in use", "fail" if needs.experiment else "warn",
                    "distributed.master_port free on the first node", f"distributed.master_port={free_port(host)}")]


def check_all(needs: Needs) -> list[Finding]:
    """Every check, in the order the report prints them."""
    findings = check_python() + check_torch(needs)
    findings += check_gpus(needs, _gpu_names())
    for check in (check_driver, check_nccl, check_topology, check_packages, check_port):
        findings += check(needs)
    return findings
