"""The CPU backend's patches, each checked inside a forked gloo rank (the parent stays unpatched)."""

import torch

from megatron_adapters import cpu_backend
from tests.distributed_harness import run_distributed


class _AllocatesOnCudaInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 3.0

    @staticmethod
    def backward(ctx, grad):
        return grad * torch.full((1,), 3.0, device=torch.cuda.current_device())


def _device_and_type_checks() -> dict:
    x = torch.ones(2)
    return {
        "enabled_again": cpu_backend.enable_cpu_backend(),
        "is_enabled": cpu_backend.is_cpu_backend_enabled(),
        "empty_str": torch.empty(2, device="cuda").device.type,
        "empty_int": torch.zeros(2, device=torch.cuda.current_device()).device.type,
        "empty_device": torch.ones(2, device=torch.device("cuda", 0)).device.type,
        "dot_cuda": x.cuda().device.type,
        "to_cuda": x.to("cuda", non_blocking=True).device.type,
        "to_kw": x.to(device="cuda").device.type,
        "to_dtype": x.to(torch.float64).dtype,
        "pinned": torch.empty(2, pin_memory=True).device.type,
        "pin_method": x.pin_memory().device.type,
        "type_fp32": x.type(),
        "type_bf16": x.bfloat16().type(),
        "type_cast": x.type("torch.cuda.HalfTensor").dtype,
        "type_cast_dtype": x.type(torch.float64).dtype,
    }


def _stream_and_rng_checks() -> dict:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    stream = torch.cuda.Stream()
    torch.cuda.current_stream().wait_stream(stream)
    with torch.cuda.stream(stream):
        event = torch.cuda.Event()
        event.record()
    event.wait()
    torch.cuda.synchronize()

    model_parallel_cuda_manual_seed(7, tp_rank=1, ep_rank=0, etp_rank=0, force_reset_rng=True)
    torch.manual_seed(11)
    with get_cuda_rng_tracker().fork():
        forked = torch.rand(4)
    after_fork = torch.rand(4)
    with get_cuda_rng_tracker().fork():
        forked_again = torch.rand(4)
    torch.manual_seed(11)
    expected_after = torch.rand(4)
    torch.manual_seed(7 + 2718 + 1)  # megatron's tensor-parallel seed for tp_rank 1
    expected_forked = torch.rand(8)
    return {
        "forked": forked,
        "forked_again": forked_again,
        "after_fork": after_fork,
        "expected_after": expected_after,
        "expected_forked": expected_forked,
    }


def _backward_checks() -> dict:
    from megatron.core.tensor_parallel.random import checkpoint

    x = torch.ones(3, requires_grad=True)
    _AllocatesOnCudaInBackward.apply(x).sum().backward()

    layer = torch.nn.Linear(4, 4)
    inp = torch.randn(2, 4)

    def block(t):
        return torch.nn.functional.gelu(layer(t)) * torch.ones(1, device="cuda")

    block(inp).sum().backward()
    plain = layer.weight.grad.clone()
    layer.weight.grad = None
    checkpoint(block, False, inp.requires_grad_()).sum().backward()  # megatron activation recompute
    return {"grad": x.grad, "plain": plain, "recomputed": layer.weight.grad}


def _all_checks() -> dict:
    return {**_device_and_type_checks(), **_stream_and_rng_checks(), **_backward_checks()}


def test_cpu_backend_patches():
    (result,) = run_distributed(_all_checks, world_size=1)
    assert result["enabled_again"] and result["is_enabled"]
    for key in (
        "empty_str",
        "empty_int",
        "empty_device",
        "dot_cuda",
        "to_cuda",
        "to_kw",
        "pinned",
        "pin_method",
    ):
        assert result[key] == "cpu", key
    assert result["to_dtype"] == torch.float64
    assert result["type_fp32"] == "torch.cuda.FloatTensor"
    assert result["type_bf16"] == "torch.cuda.BFloat16Tensor"
    assert result["type_cast"] == torch.float16
    assert result["type_cast_dtype"] == torch.float64
    # The tracker's state lives apart from the default generator and continues across forks.
    torch.testing.assert_close(result["after_fork"], result["expected_after"], rtol=0, atol=0)
    torch.testing.assert_close(result["forked"], result["expected_forked"][:4], rtol=0, atol=0)
    torch.testing.assert_close(result["forked_again"], result["expected_forked"][4:], rtol=0, atol=0)
    torch.testing.assert_close(result["grad"], torch.full((3,), 3.0))
    torch.testing.assert_close(result["recomputed"], result["plain"], rtol=0, atol=0)


def test_parent_process_is_not_patched():
    run_distributed(_device_and_type_checks, world_size=1)
    assert not cpu_backend.is_cpu_backend_enabled()
    assert torch.ones(1).type() == "torch.FloatTensor"
