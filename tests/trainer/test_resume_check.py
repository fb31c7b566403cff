"""Resuming is decided on the launching process before any rank starts: a checkpoint of another run is refused
in one line naming what differs, a finished run says so instead of training again (no ranks are launched here:
both answers come before the launch)."""

from __future__ import annotations

import json

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.run import main
from hybridflow.trainer.resume import (
    FINGERPRINT_FILE,
    check_resumable,
    checkpoint_step,
    resume_point,
    set_aside_newer,
    set_aside_previous,
)
from tests.trainer.checkpoint_dirs import checkpoint_of


def test_grpo_run_refuses_a_ppo_checkpoint_naming_the_fields(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 10)
    cfg = load_experiment("grpo_tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    assert resume_point(cfg) == ckpt
    with pytest.raises(UserError) as err:
        check_resumable(ckpt, cfg, plan_placement(cfg))
    message = str(err.value)
    assert message.startswith(f"trainer.resume: checkpoint {ckpt} is of another run")
    assert "algorithm.name ppo -> grpo" in message
    assert "roles (enabled) actor,critic,ref,rollout -> actor,ref,rollout" in message
    assert "roles.critic.parallel tp1 pp1 dp4 on ranks [0, 1, 2, 3] -> None" in message
    assert "trainer.output_dir" in message and "trainer.resume=never" in message and "\n" not in message


def test_a_changed_mesh_or_model_is_named_and_allowed_changes_pass(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 4)
    for allowed in (["trainer.lr=3e-6", "trainer.total_steps=99", "trainer.save_every=7", "trainer.val_every=2"],):
        cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", *allowed])
        check_resumable(ckpt, cfg, plan_placement(cfg))
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", "roles.critic.parallel.tp=2",
                                       "model.num_hidden_layers=2"])
    with pytest.raises(UserError, match=r"model.num_hidden_layers 4 -> 2; roles.critic.parallel tp1 pp1 dp4 "
                                        r"on ranks \[0, 1, 2, 3\] -> tp2 pp1 dp2"):
        check_resumable(ckpt, cfg, plan_placement(cfg))


def test_checkpoints_without_a_fingerprint_still_resume(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 6)
    (ckpt / FINGERPRINT_FILE).unlink()
    cfg = load_experiment("grpo_tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    check_resumable(ckpt, cfg, plan_placement(cfg))  # nothing to compare with: megatron's own checks remain
    assert checkpoint_step(ckpt) == 6


def test_run_command_refuses_in_one_line_before_launching(tmp_path, capsys):
    checkpoint_of(tmp_path, "tiny_cpu", 10)
    with pytest.raises(SystemExit) as exit_:
        main(["+experiment=grpo_tiny_cpu", f"trainer.output_dir={tmp_path}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: trainer.resume: checkpoint ")
    assert not (tmp_path / "logs").exists()  # no rank was started


def test_a_checkpoint_of_another_prompt_count_is_refused_before_launching(tmp_path, capsys):
    # Before: the ranks started, built their models, and rank 0's loader refused it (data/loader.py).
    # builtin:max_digit has 8192 prompts, 6168 of them within data.max_prompt_length=7.
    checkpoint_of(tmp_path, "tiny_cpu", 4, prompts=8192)
    with pytest.raises(SystemExit) as exit_:
        main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}", "data.max_prompt_length=7"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: trainer.resume: the checkpoint's dataset had 8192 prompts, this one has 6168; resume "
                   "with the same data.source, or trainer.resume=never"]
    assert not (tmp_path / "logs").exists()  # no rank was started
    # a finished run trains nothing, so it says where it stands whatever the data now holds
    main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}", "data.max_prompt_length=7",
          "trainer.total_steps=4"])
    assert "is complete at step 4" in capsys.readouterr().out


def test_finished_run_says_where_it_stands_instead_of_training_again(tmp_path, capsys):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 10, "trainer.total_steps=10")
    main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}", "trainer.total_steps=10"])  # returns: exit 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"hybridflow run: tiny_cpu is complete at step 10 (checkpoint {ckpt}); outputs in {tmp_path} "
                   "(metrics.jsonl, final_hf/); to train on, raise trainer.total_steps (e.g. trainer.total_steps=20)"]
    assert not (tmp_path / "logs").exists()


def test_resume_never_sets_the_previous_run_aside(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 10)
    (tmp_path / "metrics.jsonl").write_text('{"step": 10, "phase": "rl"}\n')
    (tmp_path / "samples.jsonl").write_text('{"step": 10}\n')
    cfg = load_experiment("grpo_tiny_cpu", [f"trainer.output_dir={tmp_path}", "trainer.resume=never"])
    assert resume_point(cfg) is None
    previous = set_aside_previous(cfg)
    assert previous is not None and previous.parent == tmp_path / "previous"
    assert (previous / "checkpoints" / ckpt.name / FINGERPRINT_FILE).is_file()  # moved, not deleted
    # before: samples.jsonl, final_hf/ and sft_model/ stayed and mixed with the new run's
    for name in ("metrics.jsonl", "samples.jsonl", "final_hf", "sft_model"):
        assert (previous / name).exists() and not (tmp_path / name).exists(), name
    auto = load_experiment("grpo_tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    assert resume_point(auto) is None  # a later auto resume cannot pick the PPO run's checkpoint
    assert set_aside_previous(cfg) is None  # nothing left to move


def test_explicit_resume_path_must_be_a_checkpoint(tmp_path):
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", f"trainer.resume={tmp_path}/nope"])
    with pytest.raises(UserError, match="trainer.resume: .* is not a checkpoint directory"):
        resume_point(cfg)


def test_fingerprint_file_records_the_step(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 3)
    record = json.loads((ckpt / FINGERPRINT_FILE).read_text())
    assert record["step"] == 3 and record["fingerprint"]["algorithm.name"] == "ppo"


def test_another_seed_or_other_base_weights_are_refused(tmp_path):
    """Before: neither was in the fingerprint. A new seed resumed the loader's position in the old prompt order
    over rows the new seed made; a LoRA run resumed its adapters onto another base model of the same shape."""
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    for name, seed in (("a", 0), ("b", 1)):
        save_tiny_model("llama", tmp_path / name, seed=seed)
    out = tmp_path / "run"
    ckpt = checkpoint_of(out, "grpo_tiny_cpu", 4, f"model.path={tmp_path / 'a'}")

    def problem(*overrides: str) -> str | None:
        cfg = load_experiment("grpo_tiny_cpu", [f"trainer.output_dir={out}", f"model.path={tmp_path / 'a'}",
                                                *overrides])
        try:
            check_resumable(ckpt, cfg, plan_placement(cfg))
        except UserError as err:
            return str(err)
        return None

    assert problem() is None
    assert "trainer.seed 1234 -> 7" in problem("trainer.seed=7")
    # the reference is the warm-up's SFT model; resumed without the warm-up it was the untrained one
    assert "trainer.warmup_sft_steps > 0 True -> False" in problem("trainer.warmup_sft_steps=0")
    assert problem("trainer.warmup_sft_steps=3") is None  # how many does not matter once warmed up
    assert "model.path weights " in problem(f"model.path={tmp_path / 'b'}")
    (tmp_path / "a").rename(tmp_path / "moved")  # the same weights elsewhere are the same base
    assert problem(f"model.path={tmp_path / 'moved'}") is None


def test_fingerprints_written_before_the_seed_and_weights_fields_still_resume(tmp_path):
    ckpt = checkpoint_of(tmp_path, "tiny_cpu", 4)
    record = json.loads((ckpt / FINGERPRINT_FILE).read_text())
    for key in ("trainer.seed", "model.path weights", "trainer.warmup_sft_steps > 0"):
        del record["fingerprint"][key]
    (ckpt / FINGERPRINT_FILE).write_text(json.dumps(record))
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", "trainer.seed=7"])
    check_resumable(ckpt, cfg, plan_placement(cfg))


def test_a_busy_port_is_refused_before_the_previous_run_is_moved_aside(tmp_path, capsys):
    """Before: the run took its lock, wrote plan.json and moved the previous run's checkpoints to previous/, then
    the launch found the port in use: a retry with resume=auto started from scratch."""
    import socket

    checkpoint_of(tmp_path, "tiny_cpu", 4)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as exit_:
            main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}", "trainer.resume=never",
                  f"distributed.master_port={port}"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: distributed.master_port: port {port} is in use")
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written or moved


def test_resuming_an_older_checkpoint_sets_the_newer_ones_aside(tmp_path):
    """Before: they stayed, and a later auto resume went on from the abandoned run's newest step."""
    old = checkpoint_of(tmp_path, "tiny_cpu", 1)
    newer = checkpoint_of(tmp_path, "tiny_cpu", 3)
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", f"trainer.resume={old}",
                                       "trainer.total_steps=2"])
    assert set_aside_newer(cfg, resume_point(cfg)) is not None
    assert not newer.exists() and old.is_dir()
    assert resume_point(load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}"])) == old
    elsewhere = checkpoint_of(tmp_path / "other", "tiny_cpu", 1)  # another directory's checkpoints stay
    checkpoint_of(tmp_path / "other", "tiny_cpu", 2)
    other = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", f"trainer.resume={elsewhere}"])
    assert set_aside_newer(other, elsewhere) is None
