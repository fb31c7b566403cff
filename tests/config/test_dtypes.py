"""Config owns the dtype names; every user maps them through `torch_dtype` (one definition)."""

import torch

from hybridflow.config.model import DTYPE_BYTES, DTYPES, torch_dtype


def test_every_config_dtype_maps_to_a_torch_dtype_of_its_declared_size():
    expected = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}
    assert {name: torch_dtype(name) for name in DTYPES} == expected
    assert {name: torch_dtype(name).itemsize for name in DTYPES} == DTYPE_BYTES
