"""Shared pytest setup: GPU tests skip where CUDA is absent."""

import pytest
import torch

# Multi-process tests fork ranks from this process; a forked child hangs if the parent's OpenMP pool
# was running threads, so the parent computes its references single-threaded.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
