"""The real packaged model for tests: its converted checkpoint in the default cache (converted on first use,
reused by every later test and run), or a skip naming the install when the package is absent."""

from __future__ import annotations

import importlib
import importlib.metadata
from pathlib import Path

import pytest

from hybridflow.convert.packaged_model import PACKAGED_MODELS, packaged_checkpoint


def smollm2_checkpoint() -> Path:
    record = PACKAGED_MODELS["smollm2_135m"]
    try:
        importlib.metadata.distribution(record.distribution)
        for module in ("gguf", "accelerate"):  # what transformers needs to read the GGUF
            importlib.import_module(module)
    except (importlib.metadata.PackageNotFoundError, ImportError):
        pytest.skip(f"needs the packaged model: {record.install}")
    return packaged_checkpoint("smollm2_135m")
