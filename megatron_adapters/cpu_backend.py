"""Run megatron-core on CPU processes (gloo) when CUDA is absent.

megatron-core 0.19.2 assumes a CUDA device in a handful of places. `enable_cpu_backend()` installs CPU
stand-ins for exactly those, so TP x PP x DP runs in several CPU processes and every parallel path can be
tested numerically on a machine without a GPU. It is a no-op when CUDA is available, and idempotent.
Call it once per process, after `torch.distributed` is initialised and before building models
(tests/distributed_harness.py does this in every CPU rank, with `force=True`).

The CPU *is* the device here: the "CUDA" RNG state is the CPU generator's state, "CUDA" tensors are CPU
tensors, and streams/events are synchronous no-ops (CPU ops run in program order anyway).

Patches, each with the megatron-core call sites (file:function) it serves:

1. `torch.cuda.current_device` -> 0. Called by nearly every allocation site, e.g.
   `tensor_parallel/layers.py:ColumnParallelLinear.__init__`, `utils.py:GlobalMemoryBuffer.get_tensor`,
   `pipeline_parallel/p2p_communication.py:P2PCommunicator._communicate`,
   `tensor_parallel/mappings.py` (gathers / reduce-scatters), `distributed/param_and_grad_buffer.py:
   _ParamAndGradBuffer.__init__`. The resulting `device=0` is mapped to CPU by (5).
2. `torch.cuda.synchronize`, `torch.cuda.Stream`, `torch.cuda.current_stream`, `torch.cuda.stream`,
   `torch.cuda.Event` -> synchronous no-op stand-ins. Used by
   `pipeline_parallel/p2p_communication.py:_communicate` (synchronize after batched p2p),
   `distributed/param_and_grad_buffer.py:_ParamAndGradBucketGroup` (communication stream / events),
   `distributed/distributed_data_parallel.py:DistributedDataParallel.__init__` (communication stream).
3. CUDA RNG state -> CPU generator state: `tensor_parallel/random.py:_get_cuda_rng_state` and
   `_set_cuda_rng_state` (used by `CudaRNGStatesTracker.fork`, `CheckpointFunction.forward/backward`
   for activation recompute, `_get_all_rng_states`), and `torch.cuda.get_rng_state` / `torch.cuda.manual_seed`
   (used by `tensor_parallel/random.py:CudaRNGStatesTracker.add` and `model_parallel_cuda_manual_seed`).
   Without CUDA these would raise, or (the `_lazy_call` ones) be silently dropped.
4. `Tensor.type()` of a CPU tensor reports the `torch.cuda.*` name: `optimizer/optimizer.py:
   Float16OptimizerWithFloat16Params.__init__`, `optimizer/distrib_optimizer.py:DistributedOptimizer.
   _build_model_and_main_param_groups` / `_copy_model_params_to_main_params` and
   `optimizer/clip_grads.py:clip_grad_by_total_norm_fp32` compare it with 'torch.cuda.FloatTensor' etc.
5. A `TorchFunctionMode` maps CUDA devices to CPU: `device="cuda"`, `device=torch.device("cuda", i)`,
   `device=<int>` keyword arguments (e.g. `torch.empty(..., device=torch.cuda.current_device())` in
   `tensor_parallel/layers.py`, `pipeline_parallel/p2p_communication.py`, `utils.py`; `device='cuda'` in
   `optimizer/clip_grads.py:get_grad_norm_fp32` / `clip_grad_by_total_norm_fp32`), `Tensor.cuda()`
   (`models/common/language_module/language_module.py:setup_embeddings_and_output_layer`),
   `Tensor.to("cuda")`, and drops `pin_memory=True` / `Tensor.pin_memory()` (they need a CUDA driver;
   `distributed/param_and_grad_buffer.py` and `optimizer/cpu_offloading/` offload paths).
6. The mode is re-entered inside every Python autograd `Function.backward`
   (`torch.autograd.function.BackwardCFunction.apply`): autograd's engine does not carry torch function
   modes into backward, and `tensor_parallel/random.py:CheckpointFunction.backward` (activation recompute)
   and the `tensor_parallel/mappings.py` functions allocate on `torch.cuda.current_device()` there.

7. A logging filter drops `tensor_parallel/random.py:CudaRNGStatesTracker.fork`'s "CPU RNG state changed
   within GPU RNG context" warning: with one generator for both it fires on every random op in a fork.

Not patched: `import triton` (unconditional in e.g. `transformer/moe/ops/paged_stash.py`, off the dense GPT
path; triton ships with this torch build). Sequence parallel needs TE or Apex norms (not patched: keep
`sequence_parallel=False` on CPU).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import torch
from torch.autograd.function import BackwardCFunction
from torch.overrides import TorchFunctionMode

_enabled = False

_CUDA_TYPE_NAMES = {
    "torch.FloatTensor": "torch.cuda.FloatTensor",
    "torch.HalfTensor": "torch.cuda.HalfTensor",
    "torch.BFloat16Tensor": "torch.cuda.BFloat16Tensor",
    "torch.DoubleTensor": "torch.cuda.DoubleTensor",
    "torch.LongTensor": "torch.cuda.LongTensor",
    "torch.IntTensor": "torch.cuda.IntTensor",
    "torch.ByteTensor": "torch.cuda.ByteTensor",
    "torch.BoolTensor": "torch.cuda.BoolTensor",
}


def is_cpu_backend_enabled() -> bool:
    """Whether `enable_cpu_backend()` has installed the CPU stand-ins in this process."""
    return _enabled


def _is_cuda_device(device: Any) -> bool:
    # A bare int is a CUDA ordinal in torch's device arguments (`device=torch.cuda.current_device()`).
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class _CudaAsCpuMode(TorchFunctionMode):
    """Maps CUDA device arguments and `Tensor.type()` names to their CPU equivalents (patches 4 and 5)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda or func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.type:
            return self._tensor_type(args, kwargs)
        if _is_cuda_device(kwargs.get("device")):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)

    @staticmethod
    def _tensor_type(args, kwargs):
        tensor, rest = args[0], args[1:]
        if not rest and "dtype" not in kwargs:
            name = torch.Tensor.type(tensor)
            return _CUDA_TYPE_NAMES.get(name, name)
        target = rest[0] if rest else kwargs.pop("dtype")
        if isinstance(target, str):
            target = target.replace("torch.cuda.", "torch.")
        return torch.Tensor.type(tensor, target, *rest[1:], **kwargs)


class _NullStream:
    """Synchronous stand-in for `torch.cuda.Stream` (patch 2)."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, stream) -> None:
        pass

    def wait_event(self, event) -> None:
        pass

    def record_event(self, event=None):
        return event if event is not None else _NullEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


class _NullEvent:
    """Synchronous stand-in for `torch.cuda.Event` (patch 2)."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None) -> None:
        pass

    def wait(self, stream=None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True


_DEFAULT_STREAM = _NullStream()


def _patch_torch_cuda() -> None:
    torch.cuda.current_device = lambda: 0
    torch.cuda.synchronize = lambda device=None: None
    torch.cuda.Stream = _NullStream
    torch.cuda.Event = _NullEvent
    torch.cuda.current_stream = lambda device=None: _DEFAULT_STREAM
    torch.cuda.stream = lambda stream=None: contextlib.nullcontext()
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()
    torch.cuda.manual_seed = lambda seed: torch.manual_seed(seed)


def _patch_megatron_rng() -> None:
    from megatron.core.tensor_parallel import random as mcore_random

    mcore_random._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: (
        torch.get_rng_state()
    )
    mcore_random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(
        new_state
    )
    logging.getLogger(mcore_random.__name__).addFilter(_DropSharedGeneratorWarning())


class _DropSharedGeneratorWarning(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "CPU RNG state changed within GPU RNG context" not in record.getMessage()


def _patch_autograd_backward() -> None:
    original_apply = BackwardCFunction.apply

    def apply_under_cpu_mode(self, *args):
        with _CudaAsCpuMode():
            return original_apply(self, *args)

    BackwardCFunction.apply = apply_under_cpu_mode


def enable_cpu_backend(force: bool = False) -> bool:
    """Install the CPU stand-ins listed in the module docstring, once per process.

    Returns True when the CPU backend is active (now or already), False when CUDA is available and
    nothing was changed. `force=True` installs it even on a machine with a GPU (the CPU test ranks do,
    so CPU tests mean the same everywhere) and then also makes `torch.cuda.is_available()` report False
    in this process. The device-mapping mode stays pushed for the rest of the process, so call this
    only in processes that are meant to run megatron-core on CPU (forked test ranks, CPU workers).
    """
    global _enabled
    if _enabled:
        return True
    if torch.cuda.is_available():
        if not force:
            return False
        torch.cuda.is_available = lambda: False
    _patch_torch_cuda()
    _patch_megatron_rng()
    _patch_autograd_backward()
    _CudaAsCpuMode().__enter__()
    _enabled = True
    return True


def compute_device() -> torch.device:
    """Where this rank's tensors and collectives live: its current CUDA device, or the CPU without one."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
