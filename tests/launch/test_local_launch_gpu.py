"""launch_local on real GPUs: one rank per visible GPU, NCCL, each rank bound to its own device."""

from __future__ import annotations

import pytest
import torch

from hybridflow.launch import free_port, launch_local
from tests.launch.launch_fakes import fake_plan
from tests.launch.launch_workers import DistCfg, all_reduce

pytestmark = pytest.mark.gpu


def test_nccl_all_reduce_one_rank_per_gpu(tmp_path):
    n = torch.cuda.device_count()
    port = free_port()
    results = launch_local(fake_plan(1, n), all_reduce, [str(tmp_path / "out"), port],
                           DistCfg(master_port=port, timeout_s=120), log_dir=tmp_path / "logs")
    assert sorted(results) == list(range(n))
    for rank, info in results.items():
        assert info["sum"] == n * (n + 1) / 2
        assert info["backend"] == "nccl" and info["device"] == rank
        assert info["cuda_visible_devices"] == ",".join(map(str, range(n)))
