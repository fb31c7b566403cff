"""Rendered sbatch scripts submitted to a real Slurm (slurmctld + two slurmd on this machine, CPU only).

The job's command is the launcher test worker (an all_reduce plus a record of each rank's node); set
HYBRIDFLOW_SLURM_E2E_COMMAND to run something else instead (e.g. the tiny_cpu training run:
"-m hybridflow.run +experiment=tiny_cpu cluster.nodes=2 cluster.gpus_per_node=2"); `{out}` in it is replaced
by the directory the test inspects. HYBRIDFLOW_SLURM_E2E_TIMEOUT_S bounds each job (default 180 s).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from hybridflow.launch import free_port
from hybridflow.sbatch import render_for_experiment
from tests.launch.slurm_cluster import INSTALL_HINT, SlurmCluster, missing_binaries

REPO = Path(__file__).resolve().parents[2]
NODES, PER_NODE = 2, 2
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(bool(missing_binaries()),
                       reason=f"Slurm binaries missing ({', '.join(missing_binaries())}); `{INSTALL_HINT}`"),
]


@pytest.fixture(scope="module")
def cluster():
    # A scratch directory of its own, not pytest's tmp dirs: concurrent pytest sessions prune each other's
    # old base directories, which would pull the spool and munge socket from under running daemons.
    root = Path(tempfile.mkdtemp(prefix="hf-slurm-"))
    c = SlurmCluster(root / "cluster", nodes=NODES, cpus_per_node=PER_NODE)
    try:
        c.start(timeout_s=60)
        yield c
    finally:
        c.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def job_dir(cluster, request) -> Path:
    path = cluster.root.parent / "jobs" / request.node.name.replace("[", "-").replace("]", "")
    path.mkdir(parents=True)
    return path


def _submit(cluster: SlurmCluster, job_dir: Path, launcher: str, worker_args: str) -> tuple[str, str]:
    out = job_dir / "out"
    command = os.environ.get("HYBRIDFLOW_SLURM_E2E_COMMAND", f"tests/launch/launch_workers.py {worker_args}")
    text = render_for_experiment([
        "+experiment=tiny_cpu", f"cluster.nodes={NODES}", f"cluster.gpus_per_node={PER_NODE}",
        f"distributed.master_port={free_port()}", f"slurm.launcher={launcher}", "slurm.time=00:05:00",
        f"slurm.output={job_dir}/job.out", f"slurm.workdir={REPO}", "slurm.mem=null",
        f"slurm.command='{command.format(out=out)}'",
        f"slurm.setup=['export HYBRIDFLOW_LOG_DIR={job_dir}/logs']",
    ])
    script = job_dir / "job.sbatch"
    script.write_text(text)
    job = cluster.sbatch(script)
    state = cluster.wait_job(job, timeout_s=float(os.environ.get("HYBRIDFLOW_SLURM_E2E_TIMEOUT_S", "180")))
    log = (job_dir / "job.out").read_text(errors="replace") if (job_dir / "job.out").exists() else ""
    return state, log


def _ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(NODES * PER_NODE)]


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_two_node_job_runs_with_plan_node_order(cluster, job_dir, launcher):
    state, log = _submit(cluster, job_dir, launcher, f"all_reduce {job_dir / 'out'}")
    assert state == "COMPLETED", f"job ended {state}:\n{log[-4000:]}\n{cluster.logs_tail()}"
    if "HYBRIDFLOW_SLURM_E2E_COMMAND" in os.environ:
        return
    ranks = _ranks(job_dir / "out")
    world = NODES * PER_NODE
    assert {r["sum"] for r in ranks} == {world * (world + 1) / 2}
    assert {r["launcher"] for r in ranks} == {"torchrun" if launcher == "torchrun" else "slurm"}
    # Plan node i = i-th host of Slurm's node list: ranks 0,1 on node 0 and 2,3 on node 1, as every rank saw.
    expected = [[r, r // PER_NODE] for r in range(world)]
    assert all(r["nodes_by_rank"] == expected for r in ranks)
    assert log.count("ALLREDUCE_OK") == world


def test_dead_rank_fails_the_whole_job(cluster, job_dir):
    if "HYBRIDFLOW_SLURM_E2E_COMMAND" in os.environ:
        pytest.skip("custom command: the failure scenario needs the test worker")
    state, log = _submit(cluster, job_dir, "torchrun", f"one_rank_dies {job_dir / 'out'} 29500 30 3 exit")
    assert state == "FAILED", f"job ended {state}:\n{log[-4000:]}"
    assert "rank 3 is about to fail on purpose" in log
    assert len(list((job_dir / "out").glob("rank*.json"))) == NODES * PER_NODE  # all had joined
    # The failed node's torchrun stopped its ranks and reported; srun (--kill-on-bad-exit) ended the others.
    assert "Root Cause (first observed failure)" in log, log[-4000:]


def test_tiny_cpu_training_completes_under_sbatch(cluster, job_dir, monkeypatch):
    """The CPU default itself, rendered by `hybridflow.sbatch` and submitted: 2 nodes x 2 ranks, torchrun."""
    out = job_dir / "out"
    monkeypatch.setenv("HYBRIDFLOW_SLURM_E2E_COMMAND",
                       f"-m hybridflow.run +experiment=tiny_cpu cluster.nodes={NODES} cluster.gpus_per_node={PER_NODE}"
                       " trainer.total_steps=2 trainer.warmup_sft_steps=2 trainer.output_dir={out}")
    monkeypatch.setenv("HYBRIDFLOW_SLURM_E2E_TIMEOUT_S", os.environ.get("HYBRIDFLOW_SLURM_E2E_TIMEOUT_S", "600"))
    state, log = _submit(cluster, job_dir, "torchrun", "")
    assert state == "COMPLETED", f"job ended {state}:\n{log[-4000:]}\n{cluster.logs_tail()}"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["phase"] == "rl"] == [1, 2]
    assert all(r["parity/max_abs"] <= 1e-4 for r in records if r["phase"] == "rl")
    assert (out / "final_hf" / "config.json").exists()
