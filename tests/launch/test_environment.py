"""Reading the launcher's environment: torchrun, srun one task per rank, torchrun per Slurm node, nothing."""

from __future__ import annotations

import shutil

import pytest

from hybridflow.launch import check_node_mapping, detect_launcher, slurm_hostnames, worker_env
from hybridflow.launch.environment import LauncherEnv

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
            "GROUP_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29611"}


def test_no_launcher():
    assert detect_launcher({"PATH": "/bin"}) is None
    with pytest.raises(RuntimeError, match="no launcher environment"):
        worker_env({})


def test_torchrun():
    env = detect_launcher(TORCHRUN)
    assert env == LauncherEnv("torchrun", rank=5, world_size=8, local_rank=1, local_world_size=4, node_rank=1,
                              nodes=2, master_addr="10.0.0.1", master_port=29611)


def test_slurm_batch_script_is_not_a_launcher():
    # The batch step has SLURM_PROCID=0 and SLURM_NTASKS but no SLURM_STEP_ID: treating it as rank 0 of N
    # would wait forever for ranks nobody starts.
    assert detect_launcher({"SLURM_PROCID": "0", "SLURM_NTASKS": "16", "SLURM_NNODES": "2"}) is None


def test_srun_task_per_rank_uses_master_addr_from_env():
    slurm = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "9", "SLURM_NTASKS": "16", "SLURM_LOCALID": "1",
             "SLURM_NODEID": "1", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "16",
             "SLURM_STEP_TASKS_PER_NODE": "8(x2)", "MASTER_ADDR": "gpu01"}
    env = detect_launcher(slurm, default_port=29777)
    assert (env.launcher, env.rank, env.world_size, env.local_rank) == ("slurm", 9, 16, 1)
    assert env.local_world_size == 8
    assert (env.node_rank, env.nodes, env.master_addr, env.master_port) == (1, 2, "gpu01", 29777)


@pytest.mark.skipif(shutil.which("scontrol") is None, reason="scontrol absent (apt-get install slurm-wlm)")
def test_srun_master_addr_is_first_host_of_nodelist(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\nSlurmctldHost=localhost\n")  # scontrol insists on a config to read
    monkeypatch.setenv("SLURM_CONF", str(conf))
    assert slurm_hostnames("gpu[09-11],big7") == ["gpu09", "gpu10", "gpu11", "big7"]
    env = detect_launcher({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                           "SLURM_STEP_NODELIST": "gpu[09-10]"})
    assert env.master_addr == "gpu09"


def test_torchrun_per_slurm_node_follows_slurm_node_order():
    # c10d made this agent group rank 0 (host names sort "gpu10" < "gpu9"), but Slurm lists it second.
    env = dict(TORCHRUN, RANK="1", LOCAL_RANK="1", GROUP_RANK="0", SLURM_NODEID="1", SLURM_STEP_ID="0",
               SLURM_NTASKS="2", SLURM_STEP_NUM_NODES="2")
    got = detect_launcher(env)
    assert (got.rank, got.node_rank, got.local_rank) == (5, 1, 1)


def test_torchrun_inside_srun_with_task_per_gpu_keeps_torchrun_ranks():
    env = dict(TORCHRUN, SLURM_NODEID="0", SLURM_STEP_ID="0", SLURM_NTASKS="8", SLURM_STEP_NUM_NODES="2")
    assert detect_launcher(env).rank == 5


def test_check_node_mapping():
    plan_nodes = [0, 0, 1, 1]
    ok = LauncherEnv("slurm", 2, 4, 0, 2, 1, 2, "h", 1)
    check_node_mapping(plan_nodes, ok)
    with pytest.raises(RuntimeError, match="rank 2 runs on node 0 of the job but the plan put it on node 1"):
        check_node_mapping(plan_nodes, LauncherEnv("slurm", 2, 4, 0, 2, 0, 2, "h", 1))
