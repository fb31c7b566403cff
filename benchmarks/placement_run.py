"""Run one placement of an experiment as a `python -m hybridflow.run` subprocess and collect its figures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.predict import predict_plan
from benchmarks.provenance import REPO_ROOT
from benchmarks.run_summary import read_rl_records, summarize
from hybridflow.errors import UserError
from hybridflow.launch.ports import free_port
from hybridflow.placement import plan_placement
from hybridflow.resolve import resolve_experiment

# Keys the harness sets itself; the same keys among the user's overrides are dropped.
OWNED_KEYS = ("placement", "trainer.output_dir", "trainer.total_steps", "trainer.warmup_sft_steps",
              "trainer.save_every", "distributed.master_port")


@dataclass(frozen=True)
class Sweep:
    experiment: str
    overrides: tuple[str, ...]
    warmup_steps: int
    steps: int
    out_dir: Path
    run_timeout_s: float = 1800.0
    signal_retries: int = 1  # runs again when a run is killed by a signal (not when it fails by itself)


def user_overrides(overrides: list[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped): the user's overrides without the keys the harness owns."""
    kept, dropped = [], []
    for o in overrides:
        key = o.lstrip("+~").split("=", 1)[0]
        (dropped if key in OWNED_KEYS else kept).append(o)
    return kept, dropped


def run_overrides(sweep: Sweep, placement: str, run_dir: Path, port: int | None) -> list[str]:
    """`placement` is a conf/placement name, NAME:ENGINE to also pick conf/rollout/ENGINE (e.g.
    colocated:vllm beside colocated:megatron in one sweep), and either with @lagN for trainer.rollout_lag=N
    (e.g. split_rollout,split_rollout@lag1: on-policy vs one-step-off asynchronous rollout)."""
    spec, _, lag = placement.partition("@lag")
    name, _, engine = spec.partition(":")
    out = [*sweep.overrides, f"placement={name}", *([f"rollout={engine}"] if engine else []),
           *([f"trainer.rollout_lag={lag}"] if lag else []),
           f"trainer.output_dir={run_dir}",
           f"trainer.total_steps={sweep.warmup_steps + sweep.steps}", "trainer.warmup_sft_steps=0",
           "trainer.save_every=0"]
    return out + ([f"distributed.master_port={port}"] if port is not None else [])


def run_name(placement: str) -> str:
    """The placement spec as a file and directory name (no ':' or '@')."""
    return placement.replace(":", "_").replace("@", "_")


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _launch(cmd: list[str], run_dir: Path, timeout_s: float) -> tuple[subprocess.CompletedProcess | None, float]:
    """Run one hybridflow.run into a fresh `run_dir` (stdout + stderr in run.log); None on timeout."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    start = time.perf_counter()
    with (run_dir / "run.log").open("w") as log:
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, stdout=log, stderr=subprocess.PIPE, text=True,
                                  timeout=timeout_s, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired:
            return None, time.perf_counter() - start
        log.write(proc.stderr)
    return proc, time.perf_counter() - start


def run_placement(sweep: Sweep, placement: str, simulate: bool) -> dict:
    """Plan, predict, and (unless `simulate`) run and measure one placement.

    Status: "measured", "predicted" (simulate), "skipped" (the planner rejects it; its one-line reason),
    or "failed" (the run exited non-zero; the last line of its stderr). Bad overrides raise UserError.
    """
    run_dir = (sweep.out_dir / run_name(placement)).resolve()
    record: dict = {"experiment": sweep.experiment, "placement": placement, "warmup_steps": sweep.warmup_steps,
                    "steps": sweep.steps}
    # A bad key or placement name is the user's error (raised); a plan the planner rejects is a result.
    cfg = resolve_experiment(sweep.experiment, run_overrides(sweep, placement, run_dir, None))
    try:
        plan = plan_placement(cfg)
    except UserError as err:
        return {**record, "status": "skipped", "reason": _last_line(str(err).splitlines()[0])}
    record |= {"gpus": plan.world_size, "gpu_type": cfg.cluster.gpu_type,
               "layouts": {r: f"tp{m.tp} pp{m.pp} dp{m.dp} on {len(m.ranks)}" for r, m in plan.meshes.items()}}
    try:
        record["predicted"] = predict_plan(cfg, plan)
    except (UserError, KeyError, ValueError) as err:
        record["predicted"], record["predicted_error"] = None, str(err)
    if simulate:
        return {**record, "status": "predicted"}
    cmd = [sys.executable, "-m", "hybridflow.run", f"+experiment={sweep.experiment}",
           *run_overrides(sweep, placement, run_dir, free_port())]
    record["command"] = "python " + " ".join(cmd[1:])
    for attempt in range(1 + sweep.signal_retries):
        proc, record["wall_s"] = _launch(cmd, run_dir, sweep.run_timeout_s)
        if proc is None:
            return {**record, "status": "failed", "reason": f"timed out after {sweep.run_timeout_s:.0f} s"}
        if proc.returncode >= 0:
            break
        # Killed by a signal from outside (a shared machine's cleanup): a transient, not the run's result.
        record.setdefault("retried", []).append(f"attempt {attempt + 1} killed by signal {-proc.returncode}")
    if proc.returncode != 0:
        return {**record, "status": "failed", "reason": f"exit {proc.returncode}: {_last_line(proc.stderr)}"}
    try:
        record["measured"] = summarize(read_rl_records(run_dir / "metrics.jsonl"), sweep.warmup_steps, cfg, plan)
    except (OSError, ValueError) as err:
        return {**record, "status": "failed", "reason": str(err)}
    measured = record["measured"]
    if record.get("predicted") and measured["prompt_length"] is not None:
        # Compare like with like: the table's prediction is for the lengths the run had (short prompts, early
        # stops); the config-length one stays in the JSON.
        record["predicted_at_config_lengths"] = record["predicted"]
        record["predicted"] = predict_plan(cfg, plan, (measured["prompt_length"], measured["response_length"]))
    return {**record, "status": "measured"}
