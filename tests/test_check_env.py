"""check_env: each probe against crafted inputs, and the CLI on this machine (no GPU here)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hybridflow.launch import env_checks
from hybridflow.launch.env_checks import Needs, check_driver, check_gpus, check_packages, check_port, nvlink_matrix

REPO = Path(__file__).resolve().parents[1]
GPU_NEEDS = Needs("x", gpus_per_node=8, gpu_type="H100", nodes=1, engine="vllm")

TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tSYS\tPIX\t0-55\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tSYS\tPIX\t0-55\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tSYS\tSYS\t56-111\t1\t\tN/A
GPU3\tSYS\tSYS\tSYS\t X \tSYS\t56-111\t1\t\tN/A
NIC0\tPIX\tPIX\tSYS\tSYS\t X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
  NV#  = Connection traversing a bonded set of # NVLinks
"""


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hybridflow.check_env", *args], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


def test_nvlink_matrix_reads_gpu_cells_only():
    cells = nvlink_matrix(TOPO)
    assert cells[(0, 1)] == "NV18" and cells[(1, 2)] == "NV18" and cells[(0, 3)] == "SYS"
    assert cells[(3, 3)] == "X" and len(cells) == 16  # NIC rows/columns and the legend are left out


def test_nvlink_matrix_ignores_terminal_underline():
    # Seen on an H200 machine: the header row comes wrapped in ANSI underline codes.
    text = "\t\x1b[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\nGPU0\t X \t0-15\t0\t\tN/A\n"
    assert nvlink_matrix(text) == {(0, 0): "X"}


def test_topology_warns_about_pairs_without_nvlink(monkeypatch):
    monkeypatch.setattr(env_checks, "_run", lambda argv, timeout=20: TOPO)
    (finding,) = env_checks.check_topology(GPU_NEEDS)
    assert finding.status == "warn" and "3 pairs without NVLink" in finding.value
    assert "GPU0-GPU3=SYS" in finding.fix


def test_too_few_gpus_fails_with_the_override_that_fits():
    names = ["NVIDIA H100 80GB HBM3"] * 4
    findings = check_gpus(GPU_NEEDS, names)
    assert findings[0].status == "fail" and findings[0].value.startswith("4: 4 x NVIDIA H100")
    assert "cluster.gpus_per_node=8" in findings[0].requirement and "cluster.gpus_per_node=4" in findings[0].fix


def test_wrong_gpu_type_is_a_warning():
    findings = check_gpus(Needs("x", gpus_per_node=2, gpu_type="A100"), ["NVIDIA H200"] * 2)
    assert [f.status for f in findings] == ["ok", "warn"]
    assert "cluster.gpu_type=A100" in findings[1].requirement


def test_absent_gpu_is_reported_plainly():
    (cpu,) = check_gpus(Needs(), [])
    assert cpu.status == "info" and cpu.value.startswith("none (")
    (gpu,) = check_gpus(GPU_NEEDS, [])
    assert gpu.status == "fail" and gpu.value.startswith("none (") and "8 GPUs" in gpu.requirement


@pytest.mark.parametrize("driver, status", [("535.104.05", "fail"), ("580.82.07", "ok")])
def test_driver_too_old_for_torch_cuda(monkeypatch, driver, status):
    monkeypatch.setattr(env_checks, "_run", lambda argv, timeout=20: driver + "\n")
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    (finding,) = check_driver(GPU_NEEDS)
    assert finding.status == status and finding.value == driver
    if status == "fail":
        assert "580.65.06" in finding.requirement and "pip install torch" in finding.fix


def test_wrong_megatron_and_missing_vllm(monkeypatch):
    versions = {"megatron-core": "0.18.0"}
    monkeypatch.setattr(env_checks, "_dist_version", lambda *names: versions.get(names[0]))
    found = {f.name: f for f in check_packages(GPU_NEEDS)}
    assert found["megatron-core"].status == "fail" and found["megatron-core"].fix == "pip install megatron-core==0.19.2"
    assert found["vllm"].status == "fail" and "rollout.engine=megatron" in found["vllm"].fix
    assert found["transformer-engine"].status in ("warn", "ok")  # ok when importable anyway


def test_busy_port_fails_with_a_free_one():
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        (finding,) = check_port(Needs("x", master_port=port))
    assert finding.status == "fail" and finding.fix.startswith("distributed.master_port=")
    assert int(finding.fix.split("=")[1]) != port


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without GPUs")
def test_cli_on_this_cpu_machine():
    plain = _cli()
    assert plain.returncode == 0, plain.stdout + plain.stderr
    assert "gpus" in plain.stdout and "none (no CUDA device visible" in plain.stdout
    cpu_run = _cli("+experiment=tiny_cpu")
    assert cpu_run.returncode == 0 and "experiment tiny_cpu can run here" in cpu_run.stdout
    gpu_run = _cli("+experiment=ppo_llama3_8b")
    assert gpu_run.returncode == 1
    assert "[FAIL] gpus" in gpu_run.stdout and "needs: 8 GPUs on this node" in gpu_run.stdout
    assert "experiment ppo_llama3_8b cannot run here" in gpu_run.stdout


def test_cli_bad_experiment_is_one_line_exit_2():
    out = _cli("+experiment=no_such_thing")
    assert out.returncode == 2 and out.stderr.startswith("error: experiment: 'no_such_thing' is unknown")


def test_needs_take_the_engine_the_plan_chose():
    # rollout.engine=auto: the environment is checked for the engine the ranks will build, not for "auto"
    from hybridflow.config import load_experiment
    from hybridflow.placement import plan_placement

    cfg = load_experiment("ppo_llama_1b_h200", ["rollout.engine=auto", "data.train_batch_size=256"])
    needs = Needs.from_experiment(cfg, plan_placement(cfg))
    assert needs.engine == "vllm"
    found = {f.name: f for f in check_packages(needs)}
    if env_checks._dist_version("vllm") is None:  # the CPU machines: missing is a failure for this plan
        assert found["vllm"].status == "fail"
        assert found["vllm"].requirement == "vllm>=0.20,<0.35 for rollout.engine=vllm"
