"""What a resumed run does with the outputs of the run it continues: the records past its checkpoint are
dropped (the resumed run logs those steps again, once), and the warm-up's SFT model is read from the run
that wrote the checkpoint, also when resuming into another `trainer.output_dir`."""

from __future__ import annotations

import json

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.trainer import loop
from hybridflow.trainer.resume import check_resumable, drop_records_after, last_step_since
from tests.trainer.checkpoint_dirs import checkpoint_of


def _lines(*records: dict) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def test_records_past_the_resumed_step_are_dropped(tmp_path):
    sft = [{"step": s, "phase": "sft", "loss": 1.0 / s} for s in (1, 2, 3, 4, 5, 6)]  # warm-up: its own steps
    rl = [{"step": s, "phase": "rl", "reward/mean": s / 10} for s in (1, 2, 3, 4, 5)]
    val = [{"step": 4, "phase": "val", "val/accuracy": 0.5}]
    (tmp_path / "metrics.jsonl").write_text(_lines(*sft, *rl[:4], *val, rl[4]) + '{"step": 6, "pha')  # killed
    samples = [{"step": s, "split": "train", "text": "x"} for s in (2, 4, 5)]
    (tmp_path / "samples.jsonl").write_text(_lines(*samples))
    drop_records_after(tmp_path, 4)
    assert (tmp_path / "metrics.jsonl").read_text() == _lines(*sft, *rl[:4], *val)
    assert (tmp_path / "samples.jsonl").read_text() == _lines(*samples[:2])
    assert last_step_since(tmp_path, 0) == 4
    drop_records_after(tmp_path, 4)  # nothing more to drop
    assert (tmp_path / "metrics.jsonl").read_text() == _lines(*sft, *rl[:4], *val)


def test_resuming_elsewhere_needs_the_warm_up_model_of_the_run_that_wrote_the_checkpoint(tmp_path):
    ckpt = checkpoint_of(tmp_path / "first", "tiny_cpu", 2)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path / 'second'}", f"trainer.resume={ckpt}"])
    check_resumable(ckpt, cfg, plan_placement(cfg))  # the SFT model is read from first/, not second/
    (tmp_path / "first" / "sft_model" / "config.json").unlink()
    with pytest.raises(UserError, match=rf"trainer.resume: checkpoint {ckpt} was trained after an SFT warm-up "
                                        rf"whose model \(the reference\) is not in {tmp_path / 'first'}/sft_model"):
        check_resumable(ckpt, cfg, plan_placement(cfg))
    no_warmup = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path / 'second'}", f"trainer.resume={ckpt}",
                                             "trainer.warmup_sft_steps=0"])
    # without the warm-up the resumed run took the untrained model as its reference, silently: now refused
    with pytest.raises(UserError, match=r"is of another run \(trainer\.warmup_sft_steps > 0 True -> False\)"):
        check_resumable(ckpt, no_warmup, plan_placement(no_warmup))


class _Role:
    def __init__(self):
        self.loaded = []

    def load_hf(self, hf_dir) -> None:
        self.loaded.append(hf_dir)


class _Trainer:
    def __init__(self):
        self.roles = {"ref": _Role()}


def test_the_reference_loads_from_the_checkpoints_run_and_is_copied_beside_the_new_one(tmp_path, monkeypatch):
    saved = tmp_path / "first" / "sft_model"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text('{"model_type": "llama"}')
    (saved / "model.safetensors").write_bytes(b"weights")
    monkeypatch.setattr(loop.dist, "get_rank", lambda: 0)
    trainer, here = _Trainer(), tmp_path / "second" / "sft_model"
    here.parent.mkdir()
    loop._resume_reference(trainer, saved, here)
    assert trainer.roles["ref"].loaded == [saved]
    assert (here / "model.safetensors").read_bytes() == b"weights" and not here.with_name(".sft_model.copy").exists()
    loop._resume_reference(trainer, here, here)  # resumed in place: nothing to copy
    assert trainer.roles["ref"].loaded == [saved, here]
