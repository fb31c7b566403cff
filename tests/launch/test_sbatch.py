"""Rendered sbatch scripts: valid bash, the Slurm/torchrun lines the plan implies, current templates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow.errors import UserError
from hybridflow.launch.sbatch_script import SbatchLayout, builtin_templates, render_sbatch
from hybridflow.launch.slurm_config import SlurmConfig
from hybridflow.sbatch import parse_slurm_overrides, render_for_experiment

REPO = Path(__file__).resolve().parents[2]


def _bash_syntax_ok(text: str, tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    out = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def _sbatch_options(text: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("#SBATCH ")]


def test_checked_in_templates_are_current(tmp_path):
    for name, text in builtin_templates().items():
        path = REPO / "scripts" / "slurm" / name
        assert path.read_text() == text, f"{path} is stale: python -m hybridflow.sbatch --write-templates " \
                                         "scripts/slurm"
        _bash_syntax_ok(text, tmp_path)


def test_one_node_torchrun_script(tmp_path):
    text = render_for_experiment(["+experiment=ppo_llama3_8b", "slurm.partition=gpu", "slurm.account=rl",
                                  "slurm.time=01:30:00", "trainer.total_steps=7"])
    _bash_syntax_ok(text, tmp_path)
    opts = _sbatch_options(text)
    for expected in ("--nodes=1", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=gpu",
                     "--account=rl", "--time=01:30:00", "--job-name=ppo_llama3_8b"):
        assert expected in opts
    assert "--nproc-per-node=8" in text and "--rdzv-backend=c10d" in text
    assert 'srun --ntasks-per-node=1 --kill-on-bad-exit=1' in text
    # The plan step replays the experiment and its overrides, minus the slurm.* ones; the ranks only read its plan.
    assert ('-m hybridflow.run +experiment=ppo_llama3_8b trainer.total_steps=7 --plan-only --plan "$PLAN_FILE" '
            '"$@"') in text
    assert text.rstrip().endswith('-m hybridflow.run --plan "$PLAN_FILE"')
    assert "slurm.partition" not in text.split("#SBATCH")[-1]
    assert "export CUDA_DEVICE_MAX_CONNECTIONS=1" in text and "NCCL_SOCKET_IFNAME" in text
    assert f'PYTHON="${{PYTHON:-{sys.executable}}}"' in text


def test_two_node_scripts_torchrun_and_srun(tmp_path):
    torchrun = render_for_experiment(["+experiment=ppo_llama3_70b_2node", "slurm.nccl_socket_ifname=ib0"])
    _bash_syntax_ok(torchrun, tmp_path)
    assert "--nodes=2" in _sbatch_options(torchrun) and "--ntasks-per-node=1" in _sbatch_options(torchrun)
    assert '--nnodes="$SLURM_NNODES" --nproc-per-node=8' in torchrun
    assert "export NCCL_SOCKET_IFNAME=ib0" in torchrun
    assert "#   node 1 (host 2 of the node list): ranks 8-15" in torchrun
    srun = render_for_experiment(["+experiment=ppo_llama3_70b_2node", "slurm.launcher=srun"])
    _bash_syntax_ok(srun, tmp_path)
    assert "--nodes=2" in _sbatch_options(srun) and "--ntasks-per-node=8" in _sbatch_options(srun)
    assert "srun --ntasks-per-node=8 --distribution=block --kill-on-bad-exit=1" in srun
    assert "torch.distributed.run" not in srun
    assert '"$PYTHON" -u -m hybridflow.run +experiment=ppo_llama3_70b_2node --plan-only --plan "$PLAN_FILE"' in srun
    assert srun.rstrip().endswith('"$PYTHON" -u -m hybridflow.run --plan "$PLAN_FILE"')


def test_cpu_experiment_asks_for_no_gpus(tmp_path):
    text = render_for_experiment(["+experiment=tiny_cpu", "slurm.command=my_worker.py --x 1"])
    _bash_syntax_ok(text, tmp_path)
    assert not any(o.startswith("--gpus") for o in _sbatch_options(text))
    assert "NCCL" not in text
    assert '    my_worker.py --x 1 "$@"' in text and "--nproc-per-node=4" in text


def test_port_and_setup_lines():
    text = render_sbatch(SbatchLayout(None, 4), SlurmConfig(setup=["module load cuda"], exclusive=False),
                         job_name="j", command="-m x", master_port=29611, python="py")
    assert 'export MASTER_PORT="${MASTER_PORT:-29611}"' in text
    assert "\nmodule load cuda\n" in text and "--exclusive" not in text
    assert not any(o.startswith("--nodes") for o in _sbatch_options(text))


def test_bad_slurm_overrides_name_the_key():
    with pytest.raises(UserError, match=r"^slurm.bogus: "):
        parse_slurm_overrides(["slurm.bogus=1"])
    with pytest.raises(UserError, match=r"^slurm.cpus_per_task: "):
        parse_slurm_overrides(["slurm.cpus_per_task=many"])
    with pytest.raises(UserError, match=r"^slurm.launcher: 'mpirun'"):
        parse_slurm_overrides(["slurm.launcher=mpirun"])
    slurm, rest = parse_slurm_overrides(["slurm.time=00:10:00", "trainer.seed=3"])
    assert slurm.time == "00:10:00" and rest == ["trainer.seed=3"]


def test_cli_prints_one_line_error_and_exit_2():
    out = subprocess.run([sys.executable, "-m", "hybridflow.sbatch", "+experiment=tiny_cpu", "slurm.nodes=3"],
                         capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.returncode == 2
    assert out.stderr.startswith("error: slurm.nodes: ") and len(out.stderr.strip().splitlines()) == 1
