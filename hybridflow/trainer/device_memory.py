"""GPU memory as the driver sees it beside torch's caching allocator: the step metrics' figures, and what each build
stage added, where memory the plan does not see (CUDA contexts, NCCL communicators, library workspaces) shows up
as the gap between the two, at the stage that made it."""

from __future__ import annotations

import torch

from hybridflow.units import GIB


def device_used_gib() -> float:
    """The whole device's used memory (every process, CUDA contexts and NCCL included), GiB."""
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GIB


def device_memory_gib() -> dict[str, float]:
    """torch's peak tensors, the most its caching allocator held, and the device now as the driver sees it (CUDA
    context, NCCL, any other process): the plan's estimate is of the first, its headroom covers the rest.
    Empty without CUDA."""
    if not torch.cuda.is_available():
        return {}
    return {"peak_memory_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB, "device_used_gib": device_used_gib()}


class BuildMemory:
    """Marks device memory (used on the device, reserved by torch; GiB) after each named build stage.
    Records nothing without CUDA."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, float, float]] = []

    def mark(self, stage: str) -> None:
        if not torch.cuda.is_available():
            return
        torch.cuda.synchronize()
        self.stages.append((stage, device_used_gib(), torch.cuda.memory_reserved() / GIB))

    def line(self) -> str | None:
        """One line: each stage's device-used / torch-reserved GiB and how much outside torch it added."""
        if not self.stages:
            return None
        parts, outside_before = [], 0.0
        for stage, used, reserved in self.stages:
            outside = used - reserved
            parts.append(f"{stage} {used:.2f}/{reserved:.2f} ({outside - outside_before:+.2f} outside torch)")
            outside_before = outside
        return "GPU memory by build stage, device used / torch reserved GiB: " + ", ".join(parts)
