"""The run command across a run's life, as a user meets it: a finished tiny PPO run (run again: it says it is
complete; GRPO pointed at it: one line naming what differs), resumed with more steps (it says from where),
interrupted with Ctrl-C (one line, exit 130, where to resume)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.trainer.run_helpers import REPO, rl_records, run, run_command

pytestmark = pytest.mark.slow

QUICK = ("data.train_batch_size=16", "algorithm.mini_batch_size=16", "roles.actor.micro_batch_size=8",
         "roles.critic.micro_batch_size=4", "trainer.save_every=1")


def test_resume_prints_its_checkpoint_and_ctrl_c_prints_one_line(tmp_path):
    run(tmp_path, *QUICK, "trainer.total_steps=2")
    assert (tmp_path / "checkpoints" / "step_000002" / "fingerprint.json").is_file()
    again = run(tmp_path, *QUICK, "trainer.total_steps=2")
    assert again.stdout.startswith(f"hybridflow run: tiny_cpu is complete at step 2 (checkpoint {tmp_path}/")
    assert "raise trainer.total_steps" in again.stdout and "done:" not in again.stdout  # nothing trained
    records = rl_records(tmp_path)
    shutil.rmtree(tmp_path / "final_hf")  # as a run killed while exporting leaves it (the export is renamed whole)
    run(tmp_path, *QUICK, "trainer.total_steps=2")  # before: "complete", and final_hf/ never came
    assert (tmp_path / "final_hf" / "config.json").is_file() and rl_records(tmp_path) == records
    assert not list(tmp_path.glob("*.partial"))
    grpo = subprocess.run(run_command(tmp_path, "+experiment=grpo_tiny_cpu"), cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert grpo.returncode == 2 and len(grpo.stderr.strip().splitlines()) == 1, grpo.stderr[-3000:]
    assert grpo.stderr.startswith("error: trainer.resume: checkpoint ") and "algorithm.name ppo -> grpo" in grpo.stderr

    command = run_command(tmp_path, *QUICK, "trainer.total_steps=30")
    with (tmp_path / "out.txt").open("w") as out, (tmp_path / "err.txt").open("w") as err:
        # Its own session, signalled as a group: what a terminal does with Ctrl-C.
        proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, start_new_session=True)
        try:
            deadline = time.monotonic() + 600
            while not any(r["step"] >= 3 for r in rl_records(tmp_path)):
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "err.txt").read_text()
                time.sleep(0.2)
            os.killpg(proc.pid, signal.SIGINT)
            assert proc.wait(timeout=30) == 130
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    stdout, stderr = (tmp_path / "out.txt").read_text(), (tmp_path / "err.txt").read_text()
    assert f"  resumed from step 2 (checkpoint {tmp_path}/checkpoints/step_000002)\n" in stdout
    assert "Traceback" not in stderr and "SignalException" not in stderr and "death signal" not in stderr
    last = stderr.strip().splitlines()[-1]
    found = re.fullmatch(rf"interrupted at step (\d+); last checkpoint: {tmp_path}/checkpoints/step_(\d+); "
                         rf"resume with: {re.escape(sys.executable)} -m hybridflow\.run (.*)", last)
    assert found, last
    assert int(found[1]) >= 3 and int(found[2]) in (int(found[1]), int(found[1]) - 1)
    assert found[3].split() == command[3:]  # the same command


def test_save_last_false_writes_no_checkpoint_but_the_final_model(tmp_path):
    run(tmp_path, *QUICK[:-1], "trainer.total_steps=1", "trainer.save_last=false")
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())
    assert (tmp_path / "final_hf" / "config.json").is_file()
