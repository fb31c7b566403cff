"""launch_local end to end on CPU (gloo): ranks run, the plan's GPUs become CUDA_VISIBLE_DEVICES, a rank that
dies or hangs stops the whole launch with a message naming it and its log.

All scenarios run in one driver process (tests/launch/launch_driver.py) under a hard timeout, so a broken
launcher fails these tests instead of hanging pytest.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from hybridflow.errors import UserError
from hybridflow.launch import launch_local
from hybridflow.launch.local import visible_devices
from tests.launch.launch_fakes import fake_plan
from tests.launch.launch_workers import DistCfg

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("launch")
    argv = [sys.executable, str(HERE / "launch_driver.py"), str(root)]
    proc = subprocess.Popen(argv, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"launcher scenarios did not finish in 240 s:\n{out[-3000:]}")
    assert proc.returncode == 0, out[-3000:]
    return json.loads((root / "results.json").read_text())


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _rank_files(out_dir: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(Path(out_dir).glob("rank*.json"))]


def test_all_ranks_run_and_reduce(scenarios):
    rec = scenarios["all_reduce"]
    assert rec["error"] is None
    ranks = {int(k): v for k, v in rec["result"].items()}
    assert sorted(ranks) == [0, 1, 2]
    for rank, info in ranks.items():
        assert info["sum"] == 1 + 2 + 3
        assert info["world_size"] == 3 and info["local_rank"] == rank and info["env_rank"] == str(rank)
        assert info["cuda_visible_devices"] == "0,1,2"  # the plan's local GPUs
        # Forked from a fork server that had already imported the worker module (and torch): no rank
        # re-imports them, which is what makes a launch take about a second.
        assert info["module_preloaded"]


def test_store_listens_on_loopback_only(scenarios):
    """master_addr 127.0.0.1 (a single-node run): the rendezvous store is not reachable from other addresses."""
    listeners = {tuple(v["store_listeners"]) for v in scenarios["all_reduce"]["result"].values()}
    assert listeners == {("127.0.0.1",)}


def test_module_entrypoint_runs_as_python_dash_m(scenarios):
    rec = scenarios["module_entrypoint"]
    assert rec["error"] is None and sorted(rec["result"]) == ["0", "1"]
    infos = _rank_files(rec["out_dir"])
    assert [i["rank"] for i in infos] == [0, 1] and {i["sum"] for i in infos} == {3.0}


def test_plan_gpus_index_into_inherited_visible_devices(scenarios):
    rec = scenarios["all_reduce_narrowed_gpus"]
    assert rec["error"] is None
    assert {v["cuda_visible_devices"] for v in rec["result"].values()} == {"4,5"}


@pytest.mark.parametrize("name, rank, how", [("rank_killed", 1, "killed by SIGKILL"),
                                              ("rank_exits", 2, "exited with code 1")])
def test_dead_rank_stops_everyone_and_is_named(scenarios, name, rank, how):
    rec = scenarios[name]
    assert rec["error_type"] == "LaunchError"
    first_line = rec["error"].splitlines()[0]
    assert first_line.startswith(f"rank {rank} ") and how in first_line
    log = first_line.split("log: ")[1].split(";")[0]
    assert Path(log).is_file() and "about to fail on purpose" in Path(log).read_text()
    assert "about to fail on purpose" in rec["error"]  # the log's tail is quoted
    infos = _rank_files(rec["out_dir"])
    assert len(infos) == 3  # every rank had joined before the failure
    assert all(_gone(i["pid"]) for i in infos), "a surviving rank was left running"


def test_python_exception_in_a_callable_rank_is_quoted(scenarios):
    rec = scenarios["rank_raises"]
    assert rec["error_type"] == "LaunchError"
    assert len(rec["error"].splitlines()) == 1
    assert rec["error"].startswith("rank 0 ") and "raised ValueError: bad batch on purpose at " in rec["error"]
    assert "launch_workers.py:" in rec["error"] and "in one_rank_raises" in rec["error"]
    log = rec["error"].split("traceback in ")[1].split(";")[0]
    assert 'raise ValueError("bad batch on purpose")' in Path(log).read_text()  # the full text is in the log


def test_hung_peer_makes_collective_fail_after_timeout(scenarios):
    rec = scenarios["rank_hangs"]
    assert rec["error_type"] == "LaunchError"
    assert rec["error"].startswith("rank 0 ") and "exited with code 3" in rec["error"]
    waiting = json.loads((Path(rec["out_dir"]) / "rank0.json").read_text())
    assert "timed_out_after_s" in waiting, "rank 0 was killed instead of its collective timing out"
    sleeper = json.loads((Path(rec["out_dir"]) / "rank1.json").read_text())
    assert _gone(sleeper["pid"])


def test_visible_devices_maps_through_inherited_list():
    assert visible_devices([0, 1], None) == "0,1"
    assert visible_devices([1, 2], "4,5,6,7") == "5,6"
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES"):
        visible_devices([0, 1, 2], "3,4")


def test_multi_node_plan_is_refused():
    with pytest.raises(UserError, match="cluster.nodes"):
        launch_local(fake_plan(2, 2), print, [], DistCfg(), "/nonexistent")


def test_busy_master_port_is_refused_with_a_free_one():

    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        expected = rf"distributed.master_port: port {port} is in use.*master_port=\d+"
        with pytest.raises(UserError, match=expected):
            launch_local(fake_plan(1, 2), print, [], DistCfg(master_port=port), "/nonexistent")
