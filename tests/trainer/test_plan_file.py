"""plan.json: the launcher's plan survives JSON exactly; ranks get it as `--plan FILE` and read it instead of
composing or planning, and a rank started by a launcher without one is refused with one line."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch.distributed as dist

from hybridflow.config import load_experiment
from hybridflow.config.experiment import with_engine
from hybridflow.errors import UserError
from hybridflow.placement import Plan, plan_placement
from hybridflow.trainer.plan_file import read_run, write_plan

SPLIT = ["placement.resources.actor=[0,1]", "placement.resources.rollout=[0,1]", "placement.resources.ref=[0,1]",
         "placement.resources.critic=[2,3]", "roles.critic.parallel.tp=2"]


@pytest.mark.parametrize("experiment, overrides", [
    ("tiny_cpu", []),
    ("tiny_cpu", SPLIT),
    ("tiny_cpu", ["placement=auto"]),
    ("ppo_llama3_70b_2node", []),  # two nodes, host memory, offloaded optimizer shares
    ("ppo_llama_1b_h200", []),  # update token budgets the planner picked (16384)
])
def test_plan_round_trips_through_json_exactly(experiment, overrides):
    plan = plan_placement(load_experiment(experiment, overrides))
    again = Plan.from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    assert again.to_json() == plan.to_json()


def _cfg(tmp_path, *overrides):
    return load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}", *overrides])


def test_read_run_gives_back_what_was_written(tmp_path):
    cfg = _cfg(tmp_path)
    plan = plan_placement(cfg)
    assert write_plan(cfg, plan) == tmp_path / "plan.json"
    assert read_run(tmp_path / "plan.json")[1] == plan
    elsewhere = tmp_path / "job" / "my_plan.json"
    assert write_plan(cfg, plan, elsewhere) == elsewhere and read_run(elsewhere)[1] == plan


def test_missing_plan_is_one_error_naming_the_fix(tmp_path):
    with pytest.raises(UserError, match=r"^--plan: no plan file .*; .*--plan-only"):
        read_run(tmp_path / "plan.json")


def _one_rank_group(tmp_path):
    """init_distributed's stand-in: a real gloo group of one rank (the rank tears it down when it is done)."""
    def init(distributed):
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/pg_store", rank=0, world_size=1)
    return init


def test_a_rank_tears_its_process_groups_down_when_it_is_done(tmp_path, monkeypatch):
    # Before: they were left to the interpreter's exit, where 2 of 3 vLLM runs on an H100 (stop 56) were killed
    # by SIGSEGV after their last step.
    import hybridflow.trainer.rank_main as rank_main_module

    write_plan(_cfg(tmp_path), plan_placement(_cfg(tmp_path)))
    monkeypatch.setattr(rank_main_module, "init_distributed", _one_rank_group(tmp_path))
    monkeypatch.setattr(rank_main_module, "enable_cpu_backend", lambda: False)
    monkeypatch.setattr(rank_main_module, "train", lambda c, plan: {"up": dist.is_initialized()})
    assert rank_main_module.rank_main(str(tmp_path / "plan.json")) == {"up": True}  # trained in the group
    assert not dist.is_initialized()


def test_rank_builds_from_the_loaded_plan_and_never_plans(tmp_path, monkeypatch):
    """A plan.json that differs from what planning gives is the plan a rank trains with."""
    import hybridflow.trainer.rank_main as rank_main_module
    from hybridflow.placement import config_plan, planner

    cfg = _cfg(tmp_path)
    planned = plan_placement(cfg)
    doctored = dataclasses.replace(planned, capacity_bytes=planned.capacity_bytes + 1,
                                   offload_fractions={"actor": 0.25}, update_max_tokens={"actor": 4096})
    write_plan(cfg, doctored)

    def no_planning(*args, **kwargs):
        raise AssertionError("a rank planned again")

    monkeypatch.setattr(config_plan, "plan_placement", no_planning)
    monkeypatch.setattr(planner, "build_plan", no_planning)
    monkeypatch.setattr(rank_main_module, "init_distributed", _one_rank_group(tmp_path))
    monkeypatch.setattr(rank_main_module, "enable_cpu_backend", lambda: False)
    seen = {}
    monkeypatch.setattr(rank_main_module, "train", lambda c, plan: seen.setdefault("plan", plan) and {})
    rank_main_module.rank_main(str(tmp_path / "plan.json"))
    assert seen["plan"] == doctored != planned


def test_plan_file_carries_the_resolved_config_exactly(tmp_path):
    cfg = _cfg(tmp_path, "rollout.engine=auto")
    plan = plan_placement(cfg)
    write_plan(cfg, plan)
    loaded, loaded_plan = read_run(tmp_path / "plan.json")
    assert loaded_plan == plan
    # the engine the planner chose and its defaults (trainer.parity_every) are filled in, the rest as composed
    assert loaded == with_engine(cfg, plan.rollout_engine) != cfg
    assert loaded.rollout.engine == plan.rollout_engine and loaded.trainer.parity_every is not None


def test_a_rank_reads_the_config_without_hydra_or_the_converter(tmp_path, monkeypatch):
    """Resolve once: the launcher converts and cuts the checkpoint (here: a 2-layer cut of a 3-layer one);
    a rank's load of plan.json composes nothing and converts nothing."""
    import hydra

    import hybridflow.config.load as load_module
    import hybridflow.convert.packaged_model as packaged_model
    import hybridflow.resolve as resolve_module
    import hybridflow.trainer.rank_main as rank_main_module
    from tests.megatron_adapters.tiny_hf_models import save_tiny_model

    save_tiny_model("llama", tmp_path / "full", vocab_size=128)
    monkeypatch.setenv("HYBRIDFLOW_CACHE", str(tmp_path / "cache"))
    cfg = resolve_module.resolve_experiment("grpo_tiny_cpu", [
        f"trainer.output_dir={tmp_path / 'run'}", f"model.path={tmp_path / 'full'}", "model.keep_layers=1",
        "data.max_prompt_length=16"])
    assert cfg.model.num_hidden_layers == 1 and Path(cfg.model.path) != tmp_path / "full"
    write_plan(cfg, plan_placement(cfg))

    def forbidden(*args, **kwargs):
        raise AssertionError("a rank composed or converted")

    for module, name in [(hydra, "compose"), (hydra, "initialize_config_dir"), (load_module, "compose"),
                         (load_module, "initialize_config_dir"), (load_module, "load_experiment"),
                         (packaged_model, "first_layers"), (packaged_model, "packaged_checkpoint"),
                         (packaged_model, "_made_once"), (resolve_module, "resolve_checkpoint")]:
        monkeypatch.setattr(module, name, forbidden)
    monkeypatch.setattr(rank_main_module, "init_distributed", _one_rank_group(tmp_path))
    monkeypatch.setattr(rank_main_module, "enable_cpu_backend", lambda: False)
    seen = {}
    monkeypatch.setattr(rank_main_module, "train", lambda c, plan: seen.setdefault("cfg", c) and {})
    rank_main_module.rank_main(str(tmp_path / "run" / "plan.json"))
    assert seen["cfg"] == with_engine(cfg, "megatron")


def test_config_alone_refuses_to_convert():
    with pytest.raises(UserError, match=r"^model.packaged/model.keep_layers: resolved by the launching process"):
        load_experiment("grpo_smollm2_cpu")


def test_rank_under_a_launcher_without_plan_file_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    from hybridflow.run import main

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as exit_info:
        main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --plan: this process is rank 1 of torchrun"), err
    assert "--plan-only --plan FILE" in err[0]


def test_plan_with_overrides_is_refused_in_one_line(tmp_path, capsys):
    from hybridflow.run import main

    main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path}", "--plan-only"])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--plan", str(tmp_path / "plan.json"), "trainer.seed=7"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --plan: ") and "give no overrides" in err[0], err


def test_plan_only_writes_the_plan_where_told(tmp_path, capsys):
    from hybridflow.run import main

    target = tmp_path / "job" / "plan.json"
    main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path / 'out'}", "--plan-only", "--plan", str(target)])
    assert f"wrote {target}" in capsys.readouterr().out
    cfg = _cfg(tmp_path / "out")
    assert read_run(target) == (with_engine(cfg, "megatron"), plan_placement(cfg))


@pytest.mark.parametrize("launcher_env", [
    {"RANK": "{rank}", "WORLD_SIZE": "4"},  # torchrun
    {"SLURM_PROCID": "{rank}", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0", "SLURM_NODEID": "0",  # srun
     "SLURM_LOCALID": "{rank}", "SLURM_NNODES": "1", "MASTER_ADDR": "127.0.0.1"},
])
def test_launched_ranks_read_the_plan_file_compose_nothing_and_say_one_line(tmp_path, monkeypatch, capsys,
                                                                           launcher_env):
    import hydra

    import hybridflow.config.load as load_module
    import hybridflow.resolve as resolve_module
    import hybridflow.training_run as run_module  # what `python -m hybridflow.run` runs
    from hybridflow.placement import config_plan
    from hybridflow.run import main

    plan_file = tmp_path / "job" / "plan.json"
    main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path / 'out'}", "--plan-only", "--plan", str(plan_file)])
    assert capsys.readouterr().out.count("hybridflow run: experiment tiny_cpu") == 1

    def forbidden(*a, **k):
        raise AssertionError("a launched rank composed, planned or tokenized the dataset again")

    for module, name in [(run_module, "preflight"), (run_module, "plan_placement"), (config_plan, "plan_placement"),
                         (hydra, "compose"), (load_module, "compose"), (load_module, "load_experiment"),
                         (resolve_module, "resolve_experiment")]:
        monkeypatch.setattr(module, name, forbidden)
    launched = []
    monkeypatch.setattr(run_module, "_launch", lambda cfg, plan, launcher, path: launched.append((cfg, path)))
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    said = []
    for rank in range(4):
        for key, value in launcher_env.items():
            monkeypatch.setenv(key, value.format(rank=rank))
        main(["--plan", str(plan_file)])
        said.append(capsys.readouterr().out)
    kind = "torchrun" if "RANK" in launcher_env else "slurm"
    assert said[0] == f"hybridflow run: 4 ranks started by {kind}, with {plan_file}\n"
    assert said[1:] == ["", "", ""]  # under srun too, where no RANK variable tells rank 0 apart
    assert [path for _, path in launched] == [plan_file] * 4
    assert launched[0][0].trainer.output_dir == str(tmp_path / "out")


def test_a_plan_path_that_cannot_be_written_is_one_line_and_leaves_nothing(tmp_path, capsys):
    from hybridflow.run import main

    target = tmp_path / "somedir"
    target.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main(["+experiment=tiny_cpu", f"trainer.output_dir={tmp_path / 'out'}", "--plan-only", "--plan", str(target)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --plan: {target} is a directory; give a file path"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "somedir"] and not any(target.iterdir())
    cfg = _cfg(tmp_path / "out")
    with pytest.raises(UserError, match=r"^--plan: cannot write /proc/x/plan\.json \(.*\); give a path "):
        write_plan(cfg, plan_placement(cfg), Path("/proc/x/plan.json"))
    (tmp_path / "file").write_text("")  # the default place, under trainer.output_dir
    cfg = _cfg(tmp_path / "file")
    with pytest.raises(UserError, match=r"^trainer\.output_dir: cannot write .*plan\.json \(.*\); set trainer\."):
        write_plan(cfg, plan_placement(cfg))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "out", "somedir"]
