"""`python -m hybridflow.check_env [+experiment=NAME | --config FILE] [key=value ...]`: what this machine has
(Python, torch and its CUDA, GPUs, driver, NCCL, NVLink topology, megatron-core, transformer-engine, vLLM, the
master port) and, with an experiment, whether its plan can start here. Exit code 1 when it cannot, 2 for bad input."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hybridflow.algorithms import check_algorithm
from hybridflow.config import split_argv
from hybridflow.errors import cli_errors
from hybridflow.experiment import Experiment
from hybridflow.launch.command_help import add_config_source, config_source
from hybridflow.launch.env_checks import Finding, Needs, check_all
from hybridflow.placement import plan_placement

MARK = {"ok": " ok ", "info": "info", "warn": "WARN", "fail": "FAIL"}


def format_findings(findings: Sequence[Finding]) -> str:
    """The report: one line per finding, then what it needs and how to fix it when it falls short."""
    width = max(len(f.name) for f in findings)
    lines = []
    for f in findings:
        lines.append(f"[{MARK[f.status]}] {f.name:<{width}}  {f.value}")
        if f.requirement:
            lines.append(f"       {'':<{width}}  needs: {f.requirement}")
        if f.fix:
            lines.append(f"       {'':<{width}}  fix:   {f.fix}")
    return "\n".join(lines)


def needs_from_argv(overrides: Sequence[str], config: str | None = None, config_dir: str | None = None) -> Needs:
    """Needs of the experiment named in the overrides (or `config`: a name or the user's file); general needs
    when none is named."""
    named, rest = split_argv(overrides, default_experiment=None)
    experiment = config or named
    if experiment is None and not rest and config_dir is None:
        return Needs()
    cfg = Experiment.load(experiment, rest, config_dir).config
    check_algorithm(cfg)
    return Needs.from_experiment(cfg, plan_placement(cfg))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hybridflow.check_env", description=__doc__)
    parser.add_argument("overrides", nargs="*", help="+experiment=NAME key=value ... (optional)")
    add_config_source(parser)
    args = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    with cli_errors():
        experiment, overrides, config_dir = config_source(args, default_experiment=None)
        needs = needs_from_argv(overrides, experiment, config_dir)
    findings = check_all(needs)
    print(format_findings(findings))
    failed = [f.name for f in findings if f.status == "fail"]
    target = f"experiment {needs.experiment}" if needs.experiment else "hybridflow"
    if needs.experiment and needs.nodes > 1:
        print(f"\nnote: the plan spans {needs.nodes} nodes; checked one node's share. Submit it with "
              f"python -m hybridflow.sbatch +experiment={needs.experiment}")
    if failed:
        print(f"\n{target} cannot run here: {len(failed)} problem(s) ({', '.join(failed)})")
        return 1
    print(f"\n{target} can run here")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
