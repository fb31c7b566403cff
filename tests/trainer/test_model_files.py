"""The random stand-in checkpoint of a configured shape is that family's HF model with the shape the planner used."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_stand_ins_are_made_again_for_another_shape_seed_or_task(tmp_path):
    """Before: an existing init_model/ (or tokenizer/) was reused whatever the config said, so a run started over
    in its directory with trainer.resume=never and another shape trained the old one (and recorded the new)."""
    import torch.distributed as dist

    from hybridflow.trainer.model_files import ensure_model_files

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        def made(*overrides: str) -> tuple[dict, str, int]:
            cfg = load_experiment("tiny_cpu", list(overrides))
            hf_dir, tok_dir = ensure_model_files(cfg, tmp_path / "run")
            weights = next(Path(hf_dir).glob("*.safetensors"))
            return (json.loads((Path(hf_dir) / "config.json").read_text()),
                    (Path(tok_dir) / "tokenizer.json").read_text(), weights.stat().st_mtime_ns)

        first = made()
        assert made()[2] == first[2]  # the same inputs: kept, not written again
        wider = made("model.intermediate_size=512")
        assert first[0]["intermediate_size"] != 512 == wider[0]["intermediate_size"]
        assert made("model.intermediate_size=512", "trainer.seed=9")[2] != wider[2]
        (tmp_path / "own.jsonl").write_text('{"prompt": "1+1=", "answer": "2"}\n')
        assert made(f"data.source={tmp_path / 'own.jsonl'}")[1] != first[1]  # printable ASCII, not the tasks' 13
    finally:
        dist.destroy_process_group()
