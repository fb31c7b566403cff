"""The GPU memory figures of every step (and of the build line): torch's peak tensors, its caching allocator's peak,
and the device as the driver sees it, in GiB; nothing without CUDA."""

from __future__ import annotations

import pytest
import torch

from hybridflow.trainer.device_memory import device_memory_gib
from hybridflow.units import GIB


def test_nothing_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert device_memory_gib() == {}


def test_the_driver_view_is_total_minus_free(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (30 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 31 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda: 35 * GIB)
    assert device_memory_gib() == pytest.approx(
        {"peak_memory_gib": 31.0, "peak_reserved_gib": 35.0, "device_used_gib": 50.0})


def test_build_stages_say_what_each_added_outside_torch(monkeypatch):
    from hybridflow.trainer.device_memory import BuildMemory

    readings = iter([(70, 5), (60, 5), (40, 25)])  # (free, torch reserved) GiB at each mark
    state = {}

    def mem_get_info():
        state["free"], state["reserved"] = next(readings)
        return state["free"] * GIB, 80 * GIB

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: state["reserved"] * GIB)
    memory = BuildMemory()
    for stage in ("context", "groups", "actor"):
        memory.mark(stage)
    # used 10 / 20 / 40 GiB, reserved 5 / 5 / 25: outside torch 5, then +10 (the groups), then +0 (the actor)
    assert memory.line() == ("GPU memory by build stage, device used / torch reserved GiB: "
                             "context 10.00/5.00 (+5.00 outside torch), groups 20.00/5.00 (+10.00 outside torch), "
                             "actor 40.00/25.00 (+0.00 outside torch)")


def test_no_build_line_without_cuda(monkeypatch):
    from hybridflow.trainer.device_memory import BuildMemory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    memory = BuildMemory()
    memory.mark("context")
    assert memory.line() is None
