"""What the entry points (run, plan, sbatch) say about configs: `--help` lists conf/'s groups with their options
and the common overrides; `--cfg job` prints the composed config (Hydra's flag of that name) and exits."""

from __future__ import annotations

import argparse
import textwrap
from collections.abc import Sequence
from pathlib import Path

from omegaconf import OmegaConf

from hybridflow.config import DEFAULT_EXPERIMENT, ExperimentConfig, conf_dir, split_argv
from hybridflow.errors import UserError

GROUPS = ("experiment", "model", "algorithm", "cluster", "placement", "rollout")
COMMON_OVERRIDES = (
    ("+experiment=NAME", f"pick an experiment (default {DEFAULT_EXPERIMENT})"),
    ("--config FILE", "your own experiment file (it composes the groups below; README: Your own experiment)"),
    ("-cd DIR [-cn NAME]", "your config folder joins conf/ (its experiment/, model/, ...); NAME: DIR/NAME.yaml"),
    ("algorithm=NAME placement=NAME ...", "swap one group's option"),
    ("trainer.total_steps=N", "RL steps to train (raise it to continue a finished run)"),
    ("trainer.output_dir=DIR", "metrics, checkpoints, logs and final_hf/ (default runs/<name>)"),
    ("trainer.save_every=N", "checkpoint every N steps (and after the last; trainer.save_last=false: not then)"),
    ("trainer.resume=auto|never|DIR", "resume from the newest checkpoint, start over, or a given one"),
    ("model.path=DIR", "a local HF checkpoint (its config.json sets the shape)"),
    ("data.source=FILE|builtin:TASK", ".jsonl/.parquet prompts or a built-in task"),
    ("roles.actor.parallel.tp=N", "a role's mesh (tp, pp, dp; roles actor, critic, ref, reward; the rollout's tp, dp)"),
    ("distributed.master_port=N", "the rendezvous port of a local launch"),
)


def config_epilog() -> str:
    """The help text after the options: each config group's options and the common overrides."""
    root = conf_dir()
    lines = ["config groups (conf/):"]
    for group in GROUPS:
        options = sorted(p.stem for p in (root / group).glob("*.yaml"))
        lines += textwrap.wrap(", ".join(options), width=100, initial_indent=f"  {group + ':':<12} ",
                               subsequent_indent=" " * 15, break_on_hyphens=False)
    lines.append("\ncommon overrides (any key of the config works, Hydra style: key=value, ~key):")
    lines += [f"  {key:<34} {meaning}" for key, meaning in COMMON_OVERRIDES]
    lines.append("\n--cfg job prints the whole config with its defaults (after the checks a run makes).")
    return "\n".join(lines)


def config_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """An entry point's parser: Hydra overrides as positionals, `--cfg job`, and the groups in `--help`."""
    parser = argparse.ArgumentParser(prog=prog, description=description, epilog=config_epilog(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: +experiment=NAME key=value ...")
    parser.add_argument("--cfg", choices=["job"], help="print the composed config as YAML and exit")
    add_config_source(parser)
    return parser


def add_config_source(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`, and Hydra's `--config-dir/-cd` and `--config-name/-cn`."""
    parser.add_argument("--config", metavar="FILE", help="your own experiment file (.yaml)")
    parser.add_argument("--config-dir", "-cd", metavar="DIR",
                        help="a folder of your configs: its group folders (experiment/, model/, ...) join conf/'s")
    parser.add_argument("--config-name", "-cn", metavar="NAME",
                        help="the experiment: DIR/NAME.yaml with --config-dir, else experiment NAME")


def config_source(args: argparse.Namespace, default_experiment: str | None = DEFAULT_EXPERIMENT
                  ) -> tuple[str | None, list[str], str | None]:
    """(experiment name or file, overrides, config dir) from the parsed `args` (Experiment.load's arguments)."""
    named, overrides = split_argv(args.overrides, default_experiment=None)
    picked = [flag for flag, value in (("+experiment", named), ("--config", args.config),
                                       ("--config-name", args.config_name)) if value]
    if len(picked) > 1:
        raise UserError(f"{picked[1]}: given together with {picked[0]}; name the experiment once")
    experiment = named or args.config
    if args.config_name:
        experiment = args.config_name.removesuffix(".yaml")
        if args.config_dir:
            file = Path(args.config_dir) / f"{experiment}.yaml"
            experiment = str(file) if file.is_file() else experiment
    return experiment or default_experiment, overrides, args.config_dir


def source_args(args: argparse.Namespace) -> list[str]:
    """The config-source options of `args` with their overrides: what a follow-up command repeats."""
    options = [(flag, value) for flag, value in (("--config", args.config), ("--config-dir", args.config_dir),
                                                 ("--config-name", args.config_name)) if value]
    return [part for flag, value in options for part in (flag, value)] + list(args.overrides)


def parse_config_args(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """Options may sit anywhere among the overrides (`+experiment=x --cfg job key=value`)."""
    return parser.parse_intermixed_args(list(argv))


def job_config_yaml(cfg: ExperimentConfig) -> str:
    """The config a run uses (overrides applied, derived defaults filled in) as YAML."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
