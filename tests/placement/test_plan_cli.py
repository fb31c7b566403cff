"""`python -m hybridflow.plan`: table + plan.json on success; one line, exit 2, no file on bad input."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow import cli, plan

REPO = Path(__file__).resolve().parents[2]


def run_plan(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "hybridflow.plan", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_subprocess_default_experiment_writes_plan_json_in_cwd(tmp_path):
    proc = run_plan([], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "experiment: tiny_cpu" in proc.stdout and "memory per GPU" in proc.stdout
    data = json.loads((tmp_path / "plan.json").read_text())
    assert data["experiment"] == "tiny_cpu" and data["world_size"] == 4
    assert data["meshes"]["actor"]["tp_groups"] == [[0, 1], [2, 3]]


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["+experiment=ppo_llama3_8b", "roles.critic.parallel.tp=3"],
            "error: roles.critic.parallel.tp: 3 does not divide model.num_attention_heads=32",
        ),
        (
            ["+experiment=tiny_cpu", "roles.actor.parallel.tpp=2"],
            "error: roles.actor.parallel.tpp: unknown key",
        ),
        (
            [
                "+experiment=ppo_llama3_8b_4gpu",
                "roles.actor.offload_optimizer=false",
                "roles.critic.offload_optimizer=false",
            ],
            "error: cluster.gpu_memory_gib: GPU 0 (node 0) needs",
        ),
        # the run's own checks before launching, which the planner skipped (it accepted these; the run refused)
        (["+experiment=grpo_tiny_cpu", "reward.fn=nomod:fn"], "error: reward.fn: cannot import module 'nomod'"),
        (["+experiment=tiny_cpu", "trainer.resume=nodir"], "error: trainer.resume: 'nodir' is not a checkpoint"),
    ],
)
def test_subprocess_bad_input_is_one_line_exit_2(tmp_path, args, message):
    proc = run_plan(args, tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "plan.json").exists()


def test_in_process_out_flag_and_overrides(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "sub" / "p.json"
    assert plan.main(["+experiment=ppo_llama3_8b", "roles.rollout.parallel.tp=4", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["meshes"]["rollout"]["tp"] == 4 and data["meshes"]["rollout"]["dp"] == 1
    assert len(data["memory"]) == 8 and data["capacity_bytes"] == 80 * 2**30
    text = capsys.readouterr().out
    assert "rollout  gpus 0-3" in text and "colocation sets: {actor, ref, rollout}  {critic}  {reward}" in text
    assert "note: data.source 'prompts.jsonl' is not here; the data, tokenizer and reward were not checked" in text


def test_in_process_bad_input_exits_2(tmp_path, capsys):
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as exc:
        plan.main(["+experiment=tiny_cpu", "+placement.resources.bogus=[0]", "--out", str(out)])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith("error: placement.resources.bogus: unknown role")
    assert not out.exists()


def test_cli_dispatches_plan(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the default trainer.output_dir, runs/NAME, is checked for checkpoints to resume
    assert cli.main(["plan", "+experiment=grpo_tiny_cpu", "--out", str(tmp_path / "p.json")]) == 0
    assert "experiment: grpo_tiny_cpu" in capsys.readouterr().out
    assert cli.main(["nonsense"]) == 2


@pytest.mark.parametrize("where, match", [
    (lambda tmp: tmp, r"error: --out: .* is a directory; give a file path such as .*plan\.json$"),
    (lambda tmp: "/proc/x/plan.json", r"error: --out: cannot write /proc/x/plan\.json \(.*\); give a path "),
])
def test_an_unwritable_out_is_one_line_exit_2(tmp_path, capsys, where, match):
    with pytest.raises(SystemExit) as exc:
        plan.main(["+experiment=tiny_cpu", "--out", str(where(tmp_path))])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and re.match(match, lines[0]), captured.err
    assert list(tmp_path.iterdir()) == []
