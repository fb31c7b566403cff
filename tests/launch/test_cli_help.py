"""`--help` and Hydra's `--cfg job` on the run, plan and sbatch entry points (run's `--help` used to reach Hydra's
override parser: `error: config: LexerNoViableAltException`)."""

from __future__ import annotations

import pytest
import yaml

from hybridflow import plan, run, sbatch

ENTRY_POINTS = {"run": run.main, "plan": plan.main, "sbatch": sbatch.main}


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_help_lists_config_groups_and_common_overrides(name, capsys):
    with pytest.raises(SystemExit) as exit_:
        ENTRY_POINTS[name](["--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert f"usage: python -m hybridflow.{name}" in out and "--cfg {job}" in out
    groups = out.split("config groups (conf/):")[1]
    for line in ("algorithm:   dapo, dr_grpo, grpo,", "placement:   auto, colocated,", "rollout:     megatron, vllm"):
        assert line in groups
    assert "grpo_tiny_cpu" in groups and "trainer.total_steps=N" in groups and "+experiment=NAME" in groups


@pytest.mark.parametrize("name", sorted(ENTRY_POINTS))
def test_cfg_job_prints_the_composed_config_and_does_nothing_else(name, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["+experiment=grpo_tiny_cpu", "--cfg", "job", "trainer.total_steps=7", f"trainer.output_dir={tmp_path}/r"]
    if name == "sbatch":
        args.append("slurm.time=01:00:00")  # the job's setting, not part of the run's config
    assert not ENTRY_POINTS[name](args)
    out = capsys.readouterr().out
    cfg = yaml.safe_load(out)
    assert cfg["name"] == "grpo_tiny_cpu" and cfg["algorithm"]["name"] == "grpo"
    assert cfg["trainer"]["total_steps"] == 7
    assert cfg["roles"]["ref"]["parallel"]["tp"] == cfg["roles"]["actor"]["parallel"]["tp"]  # derived defaults in
    assert "slurm" not in cfg
    assert list(tmp_path.iterdir()) == []  # no plan.json, no run directory, no script


def test_cfg_takes_only_job(capsys):
    with pytest.raises(SystemExit) as exit_:
        run.main(["--cfg", "hydra"])
    assert exit_.value.code == 2
    assert "invalid choice: 'hydra'" in capsys.readouterr().err
