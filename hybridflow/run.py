"""`python -m hybridflow.run +experiment=NAME [overrides]` (or `--config FILE`): plan, check, launch the ranks,
train. `python -m hybridflow.run --plan FILE`: run a plan written before (each rank that srun or torchrun starts
runs this: it reads the config and the plan from FILE and composes nothing). The work is `Experiment.run()`
(hybridflow/experiment.py) and `run_planned` (hybridflow/training_run.py); this shell parses the command line and
turns an interruption or a failed rank into one line."""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

from hybridflow.algorithms import check_algorithm
from hybridflow.errors import UserError, cli_errors
from hybridflow.experiment import Experiment
from hybridflow.launch.command_help import config_parser, config_source, job_config_yaml, parse_config_args
from hybridflow.trainer import resume
from hybridflow.training_run import RunFailed, RunInterrupted, read_planned, run_planned


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = config_parser("python -m hybridflow.run", __doc__)
    parser.add_argument("--plan-only", action="store_true",
                        help="plan, check and write the plan (<trainer.output_dir>/plan.json, or --plan FILE) for "
                             "the ranks that srun or torchrun start, then exit")
    parser.add_argument("--plan", metavar="FILE",
                        help="with --plan-only: where to write the plan (default <trainer.output_dir>/plan.json); "
                             "without: run the plan FILE holds, config included (what each rank srun or torchrun "
                             "starts runs; no overrides)")
    args = parse_config_args(parser, argv)
    config = None  # the run's config, once composed or read
    try:
        with cli_errors():
            if args.plan and not args.plan_only:
                if args.overrides or args.config or args.config_name or args.config_dir or args.cfg:
                    raise UserError(f"--plan: {args.plan} holds the whole config; give no overrides or config "
                                    "options with it (they belong to the --plan-only step that wrote it)")
                config, plan = read_planned(Path(args.plan))
                run_planned(config, plan, Path(args.plan))
                return
            experiment = Experiment.load(*config_source(args))
            config = experiment.config
            if args.cfg:
                check_algorithm(experiment.config)
                print(job_config_yaml(experiment.config), end="")
                return
            experiment.run(plan_only=args.plan_only, plan_file=Path(args.plan) if args.plan else None)
    except RunFailed as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    except (KeyboardInterrupt, RunInterrupted) as err:
        if not isinstance(err, RunInterrupted) or err.first:
            # On a line of its own: rank 0's progress bar may have left the cursor mid-line.
            line = "interrupted"  # still composing the config
            if isinstance(err, RunInterrupted) and config is not None:
                command = shlex.join([sys.executable, "-m", "hybridflow.run", *argv])  # the interpreter used
                line = resume.interrupted_line(err.step, config, command)
            print("\n" + line, file=sys.stderr)
        raise SystemExit(err.exit_code if isinstance(err, RunInterrupted) else 128 + signal.SIGINT) from None


if __name__ == "__main__":
    main()
