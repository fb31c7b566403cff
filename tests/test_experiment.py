"""A user's own experiment (a file and a module outside the repository) through the commands and through the
Python API (hybridflow.experiment): it plans and runs from another working directory, a typo in it is one line
naming the file and the key, and the API's plan is the one the command writes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hybridflow import plan as plan_cli
from hybridflow.errors import UserError
from hybridflow.experiment import Experiment, reward_fn_path
from hybridflow.launch import free_port
from tests.user_experiment import write_user_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def user_file(tmp_path, monkeypatch):
    """The user's experiment file in tmp_path/user; the test runs in tmp_path/elsewhere. Loading the file puts
    its folder on sys.path and imports my_rewards: both are undone afterwards."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    sys.modules.pop("my_rewards", None)  # another test's module of that name (tests/rewards) is not the user's
    modules = set(sys.modules)
    file = write_user_dir(tmp_path / "user")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    yield file
    for name in set(sys.modules) - modules:
        if name == "my_rewards":
            del sys.modules[name]


def command(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python -m hybridflow.cli ARGS` in `cwd`, with this checkout importable (as an installed package is)."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hybridflow.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=900)


def test_user_file_plans_from_another_directory_and_its_typo_is_one_line(user_file, tmp_path):
    done = command("plan", "--config", "../user/my_experiment.yaml", "trainer.lr=0.002", cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    planned = json.loads((tmp_path / "elsewhere" / "plan.json").read_text())
    assert planned["experiment"] == "my_experiment" and planned["world_size"] == 2
    assert "next: python -m hybridflow.run --config ../user/my_experiment.yaml trainer.lr=0.002" in done.stdout

    user_file.write_text(user_file.read_text().replace("total_steps: 2", "total_stepz: 2"))
    bad = command("plan", "--config", str(user_file), cwd=Path.cwd())
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert bad.stderr.startswith(f"error: {user_file}: trainer.total_stepz: unknown key; trainer takes total_steps")


def test_file_composes_groups_resolves_its_paths_and_imports_its_modules(user_file):
    cfg = Experiment.load("../user/my_experiment.yaml", ["trainer.total_steps=3"]).config
    assert (cfg.name, cfg.algorithm.name, cfg.algorithm.kl_coef) == ("my_experiment", "my_grpo", 0.04)  # grpo.yaml
    assert cfg.data.source == str(user_file.parent / "data" / "prompts.jsonl")  # against the file, not the cwd
    assert cfg.trainer.output_dir == "runs/my_experiment" and cfg.trainer.total_steps == 3  # outputs: the cwd's
    assert cfg.imports == ["my_rewards"] and "my_rewards" in sys.modules


def test_config_dir_and_name_pick_the_file_and_the_folder_groups(user_file, capsys):
    (user_file.parent / "algorithm").mkdir()
    (user_file.parent / "algorithm" / "my_defaults.yaml").write_text("name: my_grpo\nkl_coef: 0.5\n")
    user_file.write_text(user_file.read_text().replace("/algorithm: grpo", "/algorithm: my_defaults"))
    assert plan_cli.main(["-cd", str(user_file.parent), "-cn", "my_experiment", "--out", "p.json"]) == 0
    assert json.loads(Path("p.json").read_text())["experiment"] == "my_experiment"
    assert Experiment.load(user_file).config.algorithm.kl_coef == 0.5


@pytest.mark.parametrize("edit, message", [
    ("imports: [my_rewards]", "imports: [not_mine]|imports: 'not_mine' does not import (No module named"),
    ("/algorithm: grpo", "/algorithm: grpoo|defaults: algorithm: no config 'grpoo' in conf/algorithm/"),
    ("total_steps: 2", "total_steps: two|trainer.total_steps: Value 'two' of type 'str' could not be converted"),
])
def test_a_bad_file_is_one_user_error_naming_the_file_and_key(user_file, edit, message):
    replacement, expected = message.split("|")
    user_file.write_text(user_file.read_text().replace(edit, replacement))
    with pytest.raises(UserError) as err:
        Experiment.load(user_file)
    assert str(err.value).startswith(f"{user_file}: {expected}") and "\n" not in str(err.value)


def test_the_api_plan_is_the_plan_the_command_writes_and_python_changes_become_overrides(user_file):
    experiment = Experiment.load(user_file)
    experiment.config.trainer.lr = 2e-3
    experiment.config.reward.fn = sys.modules["my_rewards"].digit_reward  # a callable: its import path
    report = experiment.plan()
    assert experiment.resolved_overrides() == ["trainer.lr=0.002"]  # the reward fn's path is the file's already
    assert plan_cli.main(["--config", str(user_file), "trainer.lr=0.002", "--out", "p.json"]) == 0
    assert json.loads(Path("p.json").read_text()) == json.loads(json.dumps(report.to_json()))
    experiment.config.data.max_prompt_length = 4
    experiment.config.model.hidden_size = 64
    assert experiment.command()[2:] == ["trainer.lr=0.002", "model.hidden_size=64", "data.max_prompt_length=4"]


def test_a_change_python_cannot_carry_to_the_ranks_is_refused(user_file):
    experiment = Experiment.load(user_file)
    experiment.config.roles.ref.parallel.tp = None  # filled from the actor's when composed again
    with pytest.raises(UserError, match=r"^roles.ref.parallel.tp: the value set in Python does not survive"):
        experiment.resolved_overrides()


def setting(path, value):
    """`experiment.config.<path> = value` as a function of the config."""
    def apply(config):
        *parents, name = path.split(".")
        for part in parents:
            config = getattr(config, part)
        setattr(config, name, value)
    return apply


@pytest.mark.parametrize("path, value, overrides", [
    # each change also moves a field derived from it: the ref's mesh and micro-batches (the actor's),
    # gpu_memory_gib (gpu_type's), output_dir (name's); those are derived again, not refused
    ("roles.actor.parallel.tp", 1, ["roles.actor.parallel.tp=1"]),
    ("roles.actor.micro_batch_size", 4, ["roles.actor.micro_batch_size=4"]),
    ("roles.actor.forward_max_tokens", 0, ["roles.actor.forward_max_tokens=0"]),
    ("cluster.gpu_type", "H100", ["cluster.gpu_type='H100'"]),
    ("name", "x", ["name='x'"]),
    ("rollout.stop_token_ids", (2,), ["rollout.stop_token_ids=[2]"]),  # a tuple is the list it composes to
    ("rollout.engine_args", {"max_num_seqs": 4}, ["+rollout.engine_args.max_num_seqs=4"]),  # a new key of a map
    ("placement.resources", {"actor": [0], "ref": ["all"], "rollout": ["all"]},
     ["placement.resources.actor=[0]", "~placement.resources.critic", "~placement.resources.reward"]),
])
def test_python_changes_compose_and_fields_derived_from_them_follow(path, value, overrides):
    experiment = Experiment.load("grpo_tiny_cpu")
    setting(path, value)(experiment.config)
    assert experiment.command() == ["+experiment=grpo_tiny_cpu", *overrides]
    again = Experiment.load("grpo_tiny_cpu", overrides).config
    assert experiment.config == again  # derived fields followed, as on the command line


@pytest.mark.parametrize("path, value, message", [
    ("trainer.total_steps", "4", r"^trainer.total_steps: '4' is a str; the field takes int"),
    ("trainer.total_stepz", 3, r"^trainer.total_stepz: unknown field; did you mean trainer.total_steps\?"),
])
def test_a_bad_python_change_is_one_line_naming_the_field(path, value, message):
    experiment = Experiment.load("grpo_tiny_cpu")
    setting(path, value)(experiment.config)
    with pytest.raises(UserError, match=message) as err:
        experiment.command()
    assert "\n" not in str(err.value)


def test_overrides_given_as_one_string_are_refused():
    with pytest.raises(UserError, match=r"^overrides: .*a list"):
        Experiment.load("grpo_tiny_cpu", "trainer.total_steps=3")


def nested_reward():
    def closure(batch):
        return [0.0] * len(batch)
    return closure


@pytest.mark.parametrize("fn, why", [
    (lambda batch: [0.0], "a lambda or a nested function"),
    (nested_reward(), "a lambda or a nested function"),
])
def test_reward_callables_without_an_import_path_are_refused_in_one_line(fn, why):
    with pytest.raises(UserError, match=f"^reward.fn: .*{why}"):
        reward_fn_path(fn)
    assert reward_fn_path(nested_reward) == "tests.test_experiment:nested_reward"


@pytest.mark.slow
def test_user_experiment_runs_two_steps_from_another_directory(user_file, tmp_path):
    out = tmp_path / "out"
    done = command("run", "--config", "../user/my_experiment.yaml", f"trainer.output_dir={out}",
                   f"distributed.master_port={free_port()}", cwd=Path.cwd())
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("phase") == "rl"] == [1, 2]
    assert "done: 2 steps" in done.stdout


@pytest.mark.slow
def test_user_experiment_runs_two_steps_through_the_python_api(user_file, tmp_path):
    experiment = Experiment.load(user_file, [f"distributed.master_port={free_port()}"])
    experiment.config.trainer.output_dir = str(tmp_path / "api_out")
    experiment.config.reward.fn = sys.modules["my_rewards"].digit_reward
    result = experiment.run()
    assert result.run_dir == tmp_path / "api_out" and result.steps == 2
    assert 0.0 <= result.metrics["reward/mean"] <= 1.0 and result.metrics["phase"] == "rl"


def test_the_ranks_plan_file_imports_the_users_modules_from_another_directory(user_file, tmp_path):
    """An sbatch script's ranks run `hybridflow.run --plan FILE`, composing nothing. Before: `algorithm.name:
    'my_grpo' is unknown`, as the file's modules were imported only where the file was composed."""
    plan_file = tmp_path / "plan.json"
    done = command("run", "--config", "../user/my_experiment.yaml", "--plan-only", "--plan", str(plan_file),
                   f"trainer.output_dir={tmp_path / 'out'}", cwd=Path.cwd())
    assert done.returncode == 0, done.stderr[-3000:]
    rank = subprocess.run(  # what a rank does first with the file, in a process of its own, from another directory
        [sys.executable, "-c", "import sys; from pathlib import Path; from hybridflow.trainer.plan_file import "
         "read_run; from hybridflow.algorithms import check_algorithm; from hybridflow.rewards import "
         "resolve_reward_fn; cfg, _ = read_run(Path(sys.argv[1])); check_algorithm(cfg); "
         "print(resolve_reward_fn(cfg.reward.fn, cfg.data.source).__name__)", str(plan_file)],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert rank.returncode == 0 and rank.stdout.strip() == "digit_reward", rank.stderr[-3000:]


def test_sbatch_and_check_env_take_the_file(user_file, capsys):
    from hybridflow import check_env, sbatch

    assert sbatch.main(["--config", "../user/my_experiment.yaml", "slurm.time=00:10:00", "-o", "job.sh"]) == 0
    script = Path("job.sh").read_text()
    assert f"-m hybridflow.run --config {user_file} " in script  # absolute: the job may start elsewhere
    assert f"sbatch --config {user_file} slurm.time=00:10:00" in script
    check_env.main(["--config", "../user/my_experiment.yaml"])
    assert re.search(r"\nexperiment my_experiment (can|cannot) run here", capsys.readouterr().out)  # it loaded


@pytest.mark.slow
def test_user_experiment_plans_and_runs_from_an_installed_wheel(user_file, tmp_path):
    """The wheel carries conf/ as package data: the user's file composes its groups from there, not from a
    checkout (the wheel is installed into a folder of its own and put first on the path)."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, timeout=600)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    *map(str, wheels.glob("hybridflow-*.whl"))], check=True, capture_output=True, timeout=600)
    env = {**os.environ, "PYTHONPATH": str(site)}
    probe = "import hybridflow.config.load as m; print(m.__file__, m.conf_dir())"
    where = subprocess.run([sys.executable, "-c", probe], cwd=Path.cwd(), env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where  # the wheel's code and the wheel's conf/
    out = tmp_path / "wheel_out"
    done = subprocess.run([sys.executable, "-m", "hybridflow.cli", "run", "--config", "../user/my_experiment.yaml",
                           f"trainer.output_dir={out}", f"distributed.master_port={free_port()}"],
                          cwd=Path.cwd(), env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if r.get("phase") == "rl"] == [1, 2]
