"""The random stand-in checkpoint of a configured shape is that family's HF model with the shape the planner used."""

from __future__ import annotations

import json

import pytest

from hybridflow.config import load_experiment
from hybridflow.trainer.model_files import random_hf_checkpoint


@pytest.mark.parametrize("overrides, want_head_dim", [
    (["model.architecture=Qwen3ForCausalLM"], 32),  # Qwen3Config's own default (128) must not leak in
    (["model.architecture=Qwen3ForCausalLM", "model.head_dim=16"], 16),
    (["model.architecture=Qwen2ForCausalLM"], 32),
])
def test_random_checkpoint_has_the_planned_shape(tmp_path, overrides, want_head_dim):
    model = load_experiment("tiny_cpu", overrides).model
    random_hf_checkpoint(model, tmp_path, seed=0)
    written = json.loads((tmp_path / "config.json").read_text())
    assert written["architectures"] == [model.architecture]
    assert written["head_dim"] == want_head_dim == model.attention_head_dim
    reread = load_experiment("tiny_cpu", [f"model.path={tmp_path}"]).model
    assert (reread.architecture, reread.attention_head_dim, reread.q_dim) == (
        model.architecture, model.attention_head_dim, model.q_dim)


@pytest.mark.parametrize("dtype, want", [(None, "BF16"), ("fp32", "F32")])
def test_random_checkpoint_is_written_in_the_model_dtype(tmp_path, dtype, want):
    # fp32 regardless of model.dtype held 4 bytes per parameter in host memory (30 GiB for an 8B stand-in)
    from safetensors import safe_open

    model = load_experiment("tiny_cpu", ["model.dtype=bf16", "trainer.parity_every=0"]).model  # planned, not run
    random_hf_checkpoint(model, tmp_path, seed=0, dtype=dtype)
    with safe_open(str(next(tmp_path.glob("*.safetensors"))), "pt") as f:
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    assert dtypes == {want}
