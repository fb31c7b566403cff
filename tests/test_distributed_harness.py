"""The multi-process harness returns per-rank results and turns rank failures/hangs into test errors."""

import pytest

from tests.distributed_harness import DistributedTestError, run_distributed


def _rank_times(scale):
    import torch.distributed as dist

    return dist.get_rank() * scale, dist.get_world_size()


def _fail_on_rank_one():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        raise RuntimeError("boom on purpose")
    dist.barrier()  # rank 0 would wait forever for rank 1 here


def _hang():
    import time

    time.sleep(60)


def test_results_come_back_in_rank_order():
    assert run_distributed(_rank_times, world_size=3, args=(10,)) == [(0, 3), (10, 3), (20, 3)]


def test_rank_exception_is_reraised_with_rank_and_traceback():
    with pytest.raises(DistributedTestError, match=r"(?s)rank 1 of 2 raised.*boom on purpose"):
        run_distributed(_fail_on_rank_one, world_size=2, timeout_s=60)


def test_hung_rank_times_out():
    with pytest.raises(DistributedTestError, match="timed out after 2s"):
        run_distributed(_hang, world_size=1, timeout_s=2)
