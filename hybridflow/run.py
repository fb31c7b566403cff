"""`python -m hybridflow.run +experiment=NAME [overrides]`: plan, check, launch the ranks, train.

Outside a launcher it plans, writes the plan to <trainer.output_dir>/plan.json and starts one process per
planned rank through PyTorch's elastic launcher; each rank loads that plan. Under torchrun or srun it is one
of those ranks already and loads the plan.json that `--plan-only` wrote before the launcher started (the
script `python -m hybridflow.sbatch` renders runs that step). A finished run is not trained again; a run that
can resume from its output directory does, after its checkpoint was checked against this run.
"""

from __future__ import annotations

import shlex
import signal
import sys
from pathlib import Path

from hybridflow.algorithms import check_algorithm
from hybridflow.config import ExperimentConfig, load_experiment, split_argv
from hybridflow.errors import cli_errors
from hybridflow.launch import LauncherEnv, LaunchError, LaunchInterrupted, detect_launcher, launch_local
from hybridflow.launch.command_help import config_parser, job_config_yaml, parse_config_args
from hybridflow.launch.known_warnings import quiet_known_noise
from hybridflow.launch.output_lock import hold_output_dir
from hybridflow.placement import Plan, plan_placement
from hybridflow.placement.report import plan_summary
from hybridflow.trainer import resume
from hybridflow.trainer.plan_file import plan_path, read_plan, write_plan
from hybridflow.trainer.preflight import check_devices, preflight


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = config_parser("python -m hybridflow.run", __doc__)
    parser.add_argument("--plan-only", action="store_true",
                        help="plan, check and write <trainer.output_dir>/plan.json for ranks that srun or torchrun "
                             "start, then exit")
    args = parse_config_args(parser, argv)
    launcher = None if args.plan_only else detect_launcher()  # None: this process plans (and launches)
    first = launcher is None or launcher.rank == 0  # under torchrun/srun every rank runs this: say things once
    cfg, start_step, offset = None, 0, 0
    try:
        with cli_errors():
            experiment, overrides = split_argv(args.overrides)
            cfg = load_experiment(experiment, overrides)
            check_algorithm(cfg)
            if args.cfg:
                print(job_config_yaml(cfg), end="")
                return
            if first:  # one run per output directory, until this process ends
                hold_output_dir(cfg.trainer.output_dir)
            if launcher is None:
                plan = plan_placement(cfg)
                notes = preflight(cfg, plan)
            else:  # a rank of torchrun/srun: the `--plan-only` step planned and checked the data already
                plan = read_plan(cfg)
                check_devices(cfg, plan)
                notes = []
            start_from = resume.resume_point(cfg)
            if start_from is not None:
                resume.check_resumable(start_from, cfg, plan)
                start_step = resume.checkpoint_step(start_from)
            if launcher is None:  # checked: the ranks (local, or srun's after --plan-only) load this
                plan_file = write_plan(cfg, plan)
            if start_from is not None and start_step >= cfg.trainer.total_steps:
                if launcher is None:  # the ranks' `--plan-only` step said it
                    print(resume.complete_line(start_from, cfg), flush=True)
                return
            out = Path(cfg.trainer.output_dir)
            if launcher is None:
                print(f"hybridflow run: experiment {cfg.name}\n  plan:   {plan_summary(plan)}\n"
                      f"  output: {out.resolve()}", *notes, sep="\n", flush=True)
                if start_from is not None:
                    print(f"  {resume.resumed_line(start_from)}", flush=True)
                previous = resume.set_aside_previous(cfg)
                if previous is not None:
                    print(f"  starting over (trainer.resume=never): the previous run's checkpoints and metrics "
                          f"are in {previous}", flush=True)
            elif first:  # the header came from the `--plan-only` step
                print(f"hybridflow run: {launcher.world_size} ranks started by {launcher.launcher}, "
                      f"with {plan_path(cfg)}", flush=True)
            if args.plan_only:
                print(f"  wrote {plan_file}", flush=True)
                return
            offset = resume.metrics_size(out)
            _launch(cfg, plan, experiment, overrides, launcher)
    except (KeyboardInterrupt, LaunchInterrupted) as err:
        if first:
            # On a line of its own: rank 0's progress bar may have left the cursor mid-line.
            print("\n" + _interrupted(cfg, argv, start_step, offset), file=sys.stderr)
        code = err.exit_code if isinstance(err, LaunchInterrupted) else 128 + signal.SIGINT
        raise SystemExit(code) from None


def _interrupted(cfg: ExperimentConfig | None, argv: list[str], start_step: int, offset: int) -> str:
    """The one line for Ctrl-C: the last step logged since this launch began (else the one it started from)."""
    if cfg is None:  # still composing the config
        return "interrupted"
    step = resume.last_step_since(Path(cfg.trainer.output_dir), offset) or start_step
    return resume.interrupted_line(step, cfg, shlex.join(["python", "-m", "hybridflow.run", *argv]))


def _launch(cfg: ExperimentConfig, plan: Plan, experiment: str | None, overrides: list[str],
            launcher: LauncherEnv | None) -> None:
    """Train: in this process under torchrun/srun, else in one local process per planned rank."""
    log_dir = Path(cfg.trainer.output_dir) / "logs"
    quiet_known_noise(log_dir=log_dir)
    # Imported only now: megatron-core's import-time warnings should not bury a bad-input message.
    from hybridflow.trainer.rank_main import rank_main

    if launcher is not None:
        rank_main(experiment, overrides)
        return
    try:
        results = launch_local(plan, rank_main, (experiment, overrides), cfg.distributed, log_dir)
    except LaunchError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    last = results.get(0) or {}
    if last:
        print(f"done: {cfg.trainer.total_steps} steps, final reward {last.get('reward/mean', float('nan')):.3f}, "
              f"outputs in {cfg.trainer.output_dir}")


if __name__ == "__main__":
    main()
