"""A checkpoint directory stays data: a rank file whose pickle would run code is refused by name, and nothing
in it runs (not on the launching process's check, not when a rank reads it)."""

from __future__ import annotations

import pickle

import pytest
import torch

from hybridflow.config import load_experiment
from hybridflow.data.step_batch import StepBatch
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.role_records import Role
from hybridflow.run import main
from hybridflow.trainer.checkpoint_record import write_record
from hybridflow.trainer.rank_state import check_rank_file, rank_file, read_rank_state, write_rank_state
from hybridflow.trainer.resume import check_resumable
from tests.trainer.checkpoint_dirs import checkpoint_of


class _WritesMarker:
    """Unpickling this calls open(marker, "w"): the file appearing means the pickle ran code."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _plant(ckpt, marker, as_torch_file: bool) -> None:
    """Replace rank 1's file with a malicious pickle, and re-record the checkpoint (a forged record too)."""
    state = {"step": 2, "rng": _WritesMarker(marker)}
    path = rank_file(ckpt, 1)
    if as_torch_file:
        torch.save(state, path)
    else:
        path.write_bytes(pickle.dumps(state))
    (ckpt / "complete.json").unlink()
    write_record(ckpt)


@pytest.mark.parametrize("as_torch_file", [True, False], ids=["torch.save", "raw pickle"])
def test_a_rank_file_that_would_run_code_is_refused_by_name(tmp_path, as_torch_file):
    out, marker = tmp_path / "run", tmp_path / "ran"
    ckpt = checkpoint_of(out, "tiny_cpu", 2)
    _plant(ckpt, marker, as_torch_file)
    path = rank_file(ckpt, 1)
    for read in (check_rank_file, read_rank_state):  # the launching process's check; a rank's read
        with pytest.raises(UserError) as err:
            read(path)
        assert str(err.value).startswith(f"trainer.resume: {path} ") and "\n" not in str(err.value)
        assert not marker.exists()
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={out}"])
    with pytest.raises(UserError, match=f"trainer.resume: {path} "):
        check_resumable(ckpt, cfg, plan_placement(cfg))
    assert not marker.exists()


def test_run_command_refuses_the_planted_file_in_one_line_before_launching(tmp_path, capsys):
    out, marker = tmp_path / "run", tmp_path / "ran"
    ckpt = checkpoint_of(out, "tiny_cpu", 2)
    _plant(ckpt, marker, as_torch_file=True)
    with pytest.raises(SystemExit) as exit_:
        main(["+experiment=tiny_cpu", f"trainer.output_dir={out}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: trainer.resume: {rank_file(ckpt, 1)} "), err
    assert not marker.exists() and not (out / "logs").exists()  # nothing ran, no rank started


def test_the_rank_state_a_run_saves_reads_back(tmp_path):
    """What checkpointing.save writes (RNG states incl. numpy's, the lag-1 batch) passes both checks intact."""
    import random

    import numpy as np

    batch = StepBatch(rows=[{"prompt": "1+1", "answer": "2"}], tokens=torch.arange(6).view(1, 6),
                      prompt_lens=torch.tensor([3]), token_kinds=torch.tensor([[1, 1, 1, 2, 2, 2]]))
    state = {"step": 3, "loader": {"epoch": 0, "index": 8, "seed": 1, "num_rows": 64}, "kl": {"value": 0.1},
             "rollout_step": 3, "ready": batch, "schedulers": {Role.ACTOR: {"num_steps": 24, "lr_decay_style": "cos"}},
             "rng": {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
                     "cuda": None, "tracker": {"model-parallel-rng": torch.get_rng_state()}}}
    path = tmp_path / "rank00000.pt"
    write_rank_state(path, state)
    check_rank_file(path)
    back = read_rank_state(path)
    assert back["rng"]["python"] == state["rng"]["python"]
    assert np.array_equal(back["rng"]["numpy"][1], state["rng"]["numpy"][1])
    assert torch.equal(back["ready"].tokens, batch.tokens) and back["ready"].rows == batch.rows
    assert back["schedulers"] == state["schedulers"] and back["loader"] == state["loader"]


def test_a_rank_file_naming_role_where_it_used_to_live_still_reads(tmp_path, monkeypatch):
    """Role moved from hybridflow.config.parallel to hybridflow.role_records; a checkpoint written before the
    move pickles the LR schedules' keys under the old name and must still resume."""
    import hybridflow.config.parallel as former_home

    monkeypatch.setattr(Role, "__module__", former_home.__name__)  # what the older program wrote
    monkeypatch.setattr(former_home, "Role", Role, raising=False)
    path = tmp_path / "rank00000.pt"
    write_rank_state(path, {"schedulers": {Role.CRITIC: {"num_steps": 7}}})
    monkeypatch.undo()
    assert "hybridflow.config.parallel.Role" in torch.serialization.get_unsafe_globals_in_checkpoint(path)
    check_rank_file(path)
    assert read_rank_state(path)["schedulers"] == {Role.CRITIC: {"num_steps": 7}}
