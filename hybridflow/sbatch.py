"""`python -m hybridflow.sbatch +experiment=NAME [key=value ...] [slurm.key=value ...] [-o FILE]`: render a
ready-to-submit sbatch script from the experiment's plan.

Nodes and GPUs per node come from the plan (override `cluster.nodes=2 cluster.gpus_per_node=8`); job settings
are `slurm.*` overrides (see hybridflow/launch/slurm_config.py): slurm.time, slurm.partition, slurm.account,
slurm.launcher=torchrun|srun, slurm.command, slurm.setup=[...], ... The job runs
`python -m hybridflow.run <the same overrides>` unless slurm.command says otherwise.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hybridflow.algorithms import check_algorithm
from hybridflow.config import ExperimentConfig, split_argv
from hybridflow.config.experiment_file import is_experiment_file
from hybridflow.errors import UserError, cli_errors
from hybridflow.experiment import Experiment
from hybridflow.launch.command_help import config_parser, config_source, job_config_yaml, parse_config_args
from hybridflow.launch.sbatch_script import builtin_templates, layout_from_plan, render_sbatch
from hybridflow.launch.slurm_config import SlurmConfig
from hybridflow.placement import plan_placement

SLURM_PREFIX = "slurm."


def parse_slurm_overrides(overrides: Sequence[str]) -> tuple[SlurmConfig, list[str]]:
    """Split `slurm.key=value` overrides off the experiment's and type-check them against SlurmConfig."""
    slurm_items = [o[len(SLURM_PREFIX):] for o in overrides if o.startswith(SLURM_PREFIX)]
    rest = [o for o in overrides if not o.startswith(SLURM_PREFIX)]
    try:
        merged = OmegaConf.merge(OmegaConf.structured(SlurmConfig), OmegaConf.from_dotlist(slurm_items))
        slurm = OmegaConf.to_object(merged)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or "?"
        raise UserError(f"slurm.{key}: {str(err).splitlines()[0]}; see the fields of "
                        "hybridflow/launch/slurm_config.py:SlurmConfig") from None
    assert isinstance(slurm, SlurmConfig)
    return slurm, rest


def _has_slurm_field() -> bool:
    """True once `slurm: SlurmConfig` is part of ExperimentConfig (then Hydra checks slurm.* itself)."""
    return any(f.name == "slurm" for f in dataclasses.fields(ExperimentConfig))


def load_job(argv_overrides: Sequence[str], config: str | None = None, config_dir: str | None = None
             ) -> tuple[ExperimentConfig, SlurmConfig, list[str]]:
    """The experiment, the Slurm settings and the arguments the job's run command gets (the user's file and
    folder first). The experiment is `config` (a name or the user's file) when given, else the overrides'
    `+experiment=NAME`."""
    if _has_slurm_field():
        slurm, run_overrides = None, [o for o in argv_overrides if not o.startswith(SLURM_PREFIX)]
        overrides = list(argv_overrides)
    else:
        slurm, run_overrides = parse_slurm_overrides(argv_overrides)
        overrides = run_overrides
    named, rest = split_argv(overrides)
    experiment = Experiment.load(config or named, rest, config_dir)
    check_algorithm(experiment.config)
    cfg = experiment.config
    return cfg, slurm or cfg.slurm, [*_source_args(config, config_dir), *run_overrides]  # type: ignore[attr-defined]


def _source_args(config: str | None, config_dir: str | None) -> list[str]:
    """The run command's `--config FILE` / `--config-dir DIR` (by absolute path: the job may start elsewhere)."""
    source = [] if config is None else (["--config", str(Path(config).resolve())] if is_experiment_file(config)
                                        else [f"+experiment={config}"])
    return source + ([] if config_dir is None else ["--config-dir", str(Path(config_dir).resolve())])


def render_for_experiment(argv_overrides: Sequence[str], config: str | None = None,
                          config_dir: str | None = None) -> str:
    """The script text for `+experiment=NAME overrides...` (slurm.* included), or for `config` (a name or
    the user's file) with those overrides."""
    cfg, slurm, run_args = load_job(argv_overrides, config, config_dir)
    source = _source_args(config, config_dir)
    plan = plan_placement(cfg)
    layout = layout_from_plan(plan, request_gpus=cfg.cluster.gpu_type != "cpu")
    command = slurm.command or " ".join(["-m hybridflow.run", *map(shlex.quote, run_args)])
    header = [f"Rendered by: python -m hybridflow.sbatch {' '.join(map(shlex.quote, [*source, *argv_overrides]))}",
              f"Experiment: {cfg.name}; plan: {plan.world_size} ranks on {plan.nodes} node(s)."]
    if slurm.workdir is None:
        slurm = dataclasses.replace(slurm, workdir=os.getcwd())
    return render_sbatch(layout, slurm, job_name=slurm.job_name or cfg.name, command=command,
                         master_port=slurm.master_port or cfg.distributed.master_port,
                         python=slurm.python or sys.executable, header=header)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = config_parser("python -m hybridflow.sbatch", __doc__)
    parser.add_argument("-o", "--out", help="write the script here (default: print it)")
    parser.add_argument("--write-templates", metavar="DIR",
                        help="write the generic templates (scripts/slurm/) into DIR and exit")
    return parse_config_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.write_templates:
        for name, text in builtin_templates().items():
            path = Path(args.write_templates) / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
        return 0
    with cli_errors():
        named, _, config_dir = config_source(args, default_experiment=None)
        config = named if (args.config or args.config_name) else None  # else +experiment= in the overrides
        if args.cfg:  # the experiment's config (slurm.* settings are the job's, not the run's)
            print(job_config_yaml(load_job(args.overrides, config, config_dir)[0]), end="")
            return 0
        text = render_for_experiment(args.overrides, config, config_dir)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)
        print(f"wrote {args.out}; submit with: sbatch {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
