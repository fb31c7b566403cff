"""A training run: plan, check, resume or start over, launch the ranks, and report what the run left.

`launch_run` is what `python -m hybridflow.run` and `Experiment.run()` both do. Outside a launcher it plans,
writes the plan to <trainer.output_dir>/plan.json and starts one process per planned rank through PyTorch's
elastic launcher; each rank reads the resolved config and the plan from that plan.json.
Under torchrun or srun this process is one of those ranks already: `run_planned` reads the config and the plan
from the plan.json that `--plan-only` wrote before the launcher started, and composes nothing. A finished run is
not trained again; a run that can resume from its output directory does, after its checkpoint was checked
against this run.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hybridflow.algorithms import check_algorithm
from hybridflow.config import ExperimentConfig
from hybridflow.errors import UserError
from hybridflow.launch import (
    LauncherEnv,
    LaunchError,
    LaunchInterrupted,
    check_store_address,
    detect_launcher,
    launch_local,
)
from hybridflow.launch.known_warnings import quiet_known_noise
from hybridflow.launch.output_lock import hold_output_dir
from hybridflow.placement import Plan, plan_placement
from hybridflow.placement.report import plan_summary
from hybridflow.trainer import resume
from hybridflow.trainer.plan_file import plan_path, read_run, write_plan
from hybridflow.trainer.preflight import check_devices, preflight


@dataclass
class RunResult:
    """What a run left: its output directory, the last RL step's metrics (metrics.jsonl) and that step."""

    run_dir: Path
    metrics: dict[str, Any]
    steps: int


class RunInterrupted(Exception):
    """Ctrl-C or a signal stopped the run (every rank is stopped by then); `step` is the last one logged."""

    def __init__(self, exit_code: int, step: int, first: bool) -> None:
        super().__init__(f"interrupted at step {step}")
        self.exit_code, self.step, self.first = exit_code, step, first


class RunFailed(Exception):
    """A rank failed; the message names the rank, its log and the log's last lines."""


_RANK_FIX = ("ranks started by srun or torchrun run the plan their launcher wrote: run `python -m hybridflow.run "
             "--plan-only --plan FILE <overrides>` first, then start each rank with `python -m hybridflow.run --plan "
             "FILE` (the script `python -m hybridflow.sbatch` renders does), FILE on a filesystem every node sees")


def launch_run(cfg: ExperimentConfig, plan_only: bool = False, plan_file: Path | None = None) -> RunResult:
    """Run `cfg` (resolved: hybridflow.resolve): plan it and launch local ranks, which read it from plan.json.
    `plan_only`: plan, check and write plan.json (at `plan_file`, default <trainer.output_dir>/plan.json) for the
    ranks srun or torchrun start, then return. Under srun or torchrun (not `plan_only`) a rank runs
    `run_planned` instead: UserError here."""
    launcher = None if plan_only else detect_launcher()  # None: this process plans (and launches)
    if launcher is not None:
        raise UserError(f"--plan: this process is rank {launcher.rank} of {launcher.launcher} and was given a "
                        f"config to compose; {_RANK_FIX}")
    return _run(cfg, None, None, plan_only, plan_file or plan_path(cfg))


def read_planned(plan_file: Path) -> tuple[ExperimentConfig, Plan]:
    """The config and the plan in `plan_file` (`python -m hybridflow.run --plan FILE`); UserError if unreadable."""
    return read_run(plan_file, fix=_RANK_FIX)


def run_planned(cfg: ExperimentConfig, plan: Plan, plan_file: Path) -> RunResult:
    """Run `cfg` and `plan` as read from `plan_file` (`read_planned`): as this rank under srun or torchrun, else
    by launching the plan's local ranks. Nothing is composed, converted or planned again."""
    return _run(cfg, plan, detect_launcher(), False, plan_file)


def checks_before_launch(cfg: ExperimentConfig, plan: Plan, data: bool = True) -> tuple[Path | None, list[str]]:
    """What the run checks before anything is written, bar this machine's GPUs (the planner runs it too): the
    checkpoint it goes on from (`trainer.resume`) and that it is of this run, then (`data`) the data, tokenizer and
    reward against it. Returns (that checkpoint or None, notes for the user)."""
    start_from = resume.resume_point(cfg)
    if start_from is not None:
        resume.check_resumable(start_from, cfg, plan)
    if not data:
        return start_from, []
    # the data against the checkpoint it goes on from (a finished run trains nothing: nothing to compare)
    trains = start_from is not None and resume.checkpoint_step(start_from) < cfg.trainer.total_steps
    return start_from, preflight(cfg, plan, start_from if trains else None)


def _run(cfg: ExperimentConfig, planned: Plan | None, launcher: LauncherEnv | None, plan_only: bool,
         plan_file: Path) -> RunResult:
    """`planned`: the plan read from `plan_file` (None: plan `cfg` here and write it there); `launcher`: the
    torchrun/srun that started this rank (None: this process launches the local ranks)."""
    first = launcher is None or launcher.rank == 0  # under torchrun/srun every rank runs this: say things once
    out = Path(cfg.trainer.output_dir)
    start_step, offset = 0, 0
    try:
        check_algorithm(cfg)
        if launcher is None:
            plan = planned or plan_placement(cfg)
        else:  # a rank of torchrun/srun: the `--plan-only` step planned and checked the data already
            assert planned is not None
            plan = planned
        check_devices(cfg, plan)
        start_from, notes = checks_before_launch(cfg, plan, data=launcher is None)
        start_step = resume.checkpoint_step(start_from) if start_from is not None else 0
        # finished: trained to total_steps and exported (a run killed while exporting launches again to export)
        complete = start_from is not None and start_step >= cfg.trainer.total_steps and resume.exported(cfg, plan)
        if launcher is None and not plan_only and not complete and plan.nodes == 1:
            check_store_address(cfg.distributed)  # the local launch's store, before anything is written
        if first:  # one run per output directory, until this process ends; taken after the checks (bad input
            hold_output_dir(cfg.trainer.output_dir)  # writes nothing) and before anything is written
        if planned is None:  # checked: the ranks (local, or srun's after --plan-only) load this
            write_plan(cfg, plan, plan_file)
        if complete:
            if launcher is None:  # the ranks' `--plan-only` step said it
                print(resume.complete_line(start_from, cfg), flush=True)
            return finished(out)
        if launcher is None:
            print(f"hybridflow run: experiment {cfg.name}\n  plan:   {plan_summary(plan)}\n"
                  f"  output: {out.resolve()}", *notes, sep="\n", flush=True)
            if start_from is not None:
                print(f"  {resume.resumed_line(start_from)}", flush=True)
                if (newer := resume.set_aside_newer(cfg, start_from)) is not None:
                    print(f"  the checkpoints past it are in {newer}", flush=True)
            previous = resume.set_aside_previous(cfg)
            if previous is not None:
                print(f"  starting over (trainer.resume=never): the previous run's checkpoints and outputs "
                      f"are in {previous}", flush=True)
        elif first:  # the header came from the `--plan-only` step
            print(f"hybridflow run: {launcher.world_size} ranks started by {launcher.launcher}, "
                  f"with {plan_file}", flush=True)
        if plan_only:
            print(f"  wrote {plan_file}", flush=True)
            return finished(out)
        if launcher is None and start_from is not None:  # the records past the resumed step go before the offset
            resume.drop_records_after(out, start_step)
        offset = resume.metrics_size(out)
        _launch(cfg, plan, launcher, plan_file)
    except (KeyboardInterrupt, LaunchInterrupted) as err:
        code = err.exit_code if isinstance(err, LaunchInterrupted) else 128 + signal.SIGINT
        raise RunInterrupted(code, resume.last_step_since(out, offset) or start_step, first) from None
    return finished(out)


def finished(run_dir: Path) -> RunResult:
    """The run directory's last RL record of metrics.jsonl ({} and step 0 before any)."""
    path = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    rl = [r for r in records if r.get("phase") == "rl"]
    last = rl[-1] if rl else {}
    return RunResult(run_dir.resolve(), last, int(last.get("step", 0)))


def _launch(cfg: ExperimentConfig, plan: Plan, launcher: LauncherEnv | None, plan_file: Path) -> None:
    """Train from `plan_file`: in this process under torchrun/srun, else in one local process per planned rank."""
    log_dir = Path(cfg.trainer.output_dir) / "logs"
    quiet_known_noise(log_dir=log_dir)
    # Imported only now: megatron-core's import-time warnings should not bury a bad-input message.
    from hybridflow.trainer.rank_main import rank_main

    if launcher is not None:
        rank_main(str(plan_file))
        return
    try:
        results = launch_local(plan, rank_main, (str(plan_file),), cfg.distributed, log_dir)
    except LaunchError as err:
        raise RunFailed(str(err)) from None
    last = results.get(0) or {}
    if last:
        print(f"done: {cfg.trainer.total_steps} steps, final reward {last.get('reward/mean', float('nan')):.3f}, "
              f"outputs in {cfg.trainer.output_dir}")
