"""The multi-process harness returns per-rank results and turns rank failures/hangs into test errors;
HYBRIDFLOW_TEST_DEVICE picks the default device."""

from typing import NamedTuple

import pytest
import torch

from tests.distributed_harness import (
    DEVICE_ENV,
    DistributedTestError,
    default_device,
    disable_tf32,
    move_tensors,
    run_distributed,
)


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


def _compile_pool_task():
    from torch._inductor.async_compile import AsyncCompile

    return AsyncCompile.pool().submit(lambda: "built").result(timeout=20)


def test_a_rank_forked_after_the_parent_compiled_can_compile(monkeypatch):
    """The CPU torch.compile of a rank forked after the pytest process compiled (CI's slow tier: the logprobs
    kernels, then the fused decode) ran on the parent's cached thread pool, threadless in the fork: it hung."""
    from torch._inductor import config
    from torch._inductor.async_compile import AsyncCompile

    monkeypatch.setattr(config, "compile_threads", 2)  # the pool exists only with 2 or more compile threads
    try:
        assert _compile_pool_task() == "built"  # the parent's pool now has threads, which a fork does not copy
        assert run_distributed(_compile_pool_task, world_size=1, device="cpu", timeout_s=60) == ["built"]
    finally:  # this pool was made with the patched thread count: later compiles get a pool of their own
        AsyncCompile.pool().shutdown()
        AsyncCompile.pool.cache_clear()


def test_results_come_back_in_rank_order():
    assert run_distributed(_rank_times, world_size=3, args=(10,)) == [(0, 3), (10, 3), (20, 3)]


def test_rank_exception_is_reraised_with_rank_and_traceback():
    with pytest.raises(DistributedTestError, match=r"(?s)rank 1 of 2 raised.*boom on purpose"):
        run_distributed(_fail_on_rank_one, world_size=2, timeout_s=60)


def test_hung_rank_times_out():
    with pytest.raises(DistributedTestError, match="timed out after 2s"):
        run_distributed(_hang, world_size=1, timeout_s=2)


def _backend():
    import torch.distributed as dist

    return dist.get_backend()


def test_device_env_switch_selects_the_default_device(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    assert default_device() == "cpu"
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    assert default_device() == "cuda"
    monkeypatch.setenv(DEVICE_ENV, "gpu")
    with pytest.raises(ValueError, match=f"^{DEVICE_ENV}='gpu': use 'cpu'"):
        default_device()


def test_device_env_reaches_run_distributed(monkeypatch):
    # One rank more than this machine has GPUs: a cuda default fails before any rank starts; cpu would run.
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    world = torch.cuda.device_count() + 1
    with pytest.raises(ValueError, match=f"^{DEVICE_ENV}: 'cuda' runs rank r on GPU r, so world_size={world}"):
        run_distributed(_backend, world_size=world)


def test_explicit_device_wins_over_the_env_switch(monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    assert run_distributed(_backend, world_size=1, device="cpu") == ["gloo"]


class _Pair(NamedTuple):
    tensor: torch.Tensor
    label: str


def test_move_tensors_keeps_structure_leaves_and_requires_grad():
    weight = torch.ones(2, requires_grad=True)
    value = {"a": [torch.zeros(3), (weight, 7)], "pair": _Pair(torch.ones(1), "x"), "n": None}
    moved = move_tensors(value, torch.device("meta"))
    assert moved["a"][0].device.type == "meta" and moved["a"][0].shape == (3,)
    assert moved["a"][1][1] == 7 and moved["n"] is None
    assert moved["a"][1][0].requires_grad and moved["a"][1][0].is_leaf
    assert isinstance(moved["pair"], _Pair) and moved["pair"].tensor.device.type == "meta"
    assert moved["pair"].label == "x" and value["a"][0].device.type == "cpu"  # the input is not changed


def test_disable_tf32_turns_off_matmul_and_cudnn_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        disable_tf32()
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
