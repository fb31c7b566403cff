"""A checkpoint holds LoRA adapters only, so a run resumes it only with the same adapters, and a full fine-tuning
checkpoint only without them: the launcher names the field in one line before any rank starts."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.trainer.resume import check_resumable
from tests.trainer.checkpoint_dirs import checkpoint_of

LORA = "roles.actor.lora.rank=8"


@pytest.mark.parametrize("saved, resuming, change", [
    ((), (LORA,), "roles.actor.lora None -> rank 8 alpha 32 on qkv,proj,fc1,fc2"),
    ((LORA,), (), "roles.actor.lora rank 8 alpha 32 on qkv,proj,fc1,fc2 -> None"),
    ((LORA,), (LORA, "roles.actor.lora.target_modules=[qkv]"),
     "roles.actor.lora rank 8 alpha 32 on qkv,proj,fc1,fc2 -> rank 8 alpha 32 on qkv"),
])
def test_adapters_must_match_the_checkpoint(tmp_path, saved, resuming, change):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 2, *saved)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", *resuming])
    with pytest.raises(UserError, match="is of another run") as err:
        check_resumable(ckpt, cfg, plan_placement(cfg))
    assert change in str(err.value) and "\n" not in str(err.value)


def test_same_adapters_resume(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 2, LORA)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", LORA, "roles.actor.lora.dropout=0.1"])
    check_resumable(ckpt, cfg, plan_placement(cfg))  # dropout changes no saved tensor
