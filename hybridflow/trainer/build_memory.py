"""The device memory each build stage added, as the driver sees it beside torch's caching allocator: memory the
plan does not see (CUDA contexts, NCCL communicators, library workspaces) shows up as the gap between the two,
at the stage that made it."""

from __future__ import annotations

import torch

from hybridflow.units import GIB


class BuildMemory:
    """Marks device memory (used on the device, reserved by torch; GiB) after each named build stage.
    Records nothing without CUDA."""

    def __init__(self) -> None:
        self.stages: list[tuple[str, float, float]] = []

    def mark(self, stage: str) -> None:
        if not torch.cuda.is_available():
            return
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        self.stages.append((stage, (total - free) / GIB, torch.cuda.memory_reserved() / GIB))

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
