"""A corrupt or incomplete checkpoint is found before any rank starts: `auto` passes over it to the newest
complete one, saying so in the one `resumed from` line and deleting nothing; an explicit `trainer.resume=DIR`
that is corrupt is refused in one line naming what is wrong."""

from __future__ import annotations

import os

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.run import main
from hybridflow.trainer.checkpoint_record import COMPLETE_FILE
from hybridflow.trainer.rank_state import rank_file
from hybridflow.trainer.resume import checkpoint_problem, resume_point, resumed_line
from tests.trainer.checkpoint_dirs import checkpoint_of


def _truncate(path, keep: int = 100) -> None:
    with path.open("r+b") as f:
        f.truncate(keep)


def _flip_a_byte(path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))


# Each way the newest checkpoint is broken, and the words that must name it.
BREAKS = {
    "truncated distcp": (lambda c: _truncate(c / "__0_0.distcp"), "__0_0.distcp is 100 bytes, 8192 when saved"),
    "no .metadata": (lambda c: (c / ".metadata").unlink(), ".metadata is missing"),
    "no metadata.json": (lambda c: (c / "metadata.json").unlink(), "metadata.json is missing"),
    "truncated rank file": (lambda c: _truncate(rank_file(c, 3)), "rank00003.pt is 100 bytes"),
    "rank file changed in place": (lambda c: _flip_a_byte(rank_file(c, 1)), "rank00001.pt differs from the file saved"),
    "no marker, no .metadata": (lambda c: [(c / COMPLETE_FILE).unlink(), (c / ".metadata").unlink()],
                                ".metadata missing (no complete.json"),
    "no marker, a rank file missing": (lambda c: [(c / COMPLETE_FILE).unlink(), rank_file(c, 2).unlink()],
                                       "rank00002.pt missing"),
}


@pytest.mark.parametrize("name", BREAKS)
def test_auto_skips_a_broken_newest_checkpoint_in_one_line_and_keeps_it(tmp_path, name):
    older = checkpoint_of(tmp_path, "tiny_cpu", 2)
    newest = checkpoint_of(tmp_path, "tiny_cpu", 4)
    break_it, words = BREAKS[name]
    break_it(newest)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    assert resume_point(cfg) == older
    line = resumed_line(older)
    assert "\n" not in line and line.startswith(f"resumed from step 2 (checkpoint {older})")
    assert f"skipped, and kept: {newest.name} is incomplete (" in line and words in line, line
    assert newest.is_dir() and checkpoint_problem(older) is None  # nothing deleted, the older one untouched


@pytest.mark.parametrize("name", ["truncated distcp", "no .metadata", "truncated rank file"])
def test_an_explicit_broken_checkpoint_is_refused_in_one_line_before_launch(tmp_path, capsys, name):
    checkpoint_of(tmp_path, "tiny_cpu", 2)
    newest = checkpoint_of(tmp_path, "tiny_cpu", 4)
    break_it, words = BREAKS[name]
    break_it(newest)
    with pytest.raises(SystemExit) as exit_:
        main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path / 'new'}", f"trainer.resume={newest}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: trainer.resume: checkpoint {newest} is incomplete or "
                                               f"corrupt ({words}"), err
    assert not (tmp_path / "new" / "logs").exists()


def test_checkpoints_older_than_records_are_used_when_their_files_are_there(tmp_path):
    """No complete.json: written by older code (a checkpoint is only renamed final after the record is
    written), so it is used, unverified, and the resume line says so."""
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 4, record=False)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    assert resume_point(cfg) == ckpt
    assert resumed_line(ckpt) == (f"resumed from step 4 (checkpoint {ckpt}, older than completeness records: "
                                  "its files are there, unverified)")


def test_auto_refuses_when_no_checkpoint_is_complete(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 4)
    os.remove(ckpt / ".metadata")
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    with pytest.raises(UserError, match=r"trainer.resume: no complete checkpoint in .* \(the newest, step_000004: "
                                        r"\.metadata is missing\); .*trainer.resume=never"):
        resume_point(cfg)
    assert ckpt.is_dir()
