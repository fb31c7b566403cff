"""The GPU memory figures of every step (and of the build line): torch's peak tensors, its caching allocator's peak,
and the device as the driver sees it, in GiB; nothing without CUDA."""

from __future__ import annotations

import pytest
import torch

from hybridflow.trainer.metrics import device_memory_gib
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
