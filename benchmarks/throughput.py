"""Throughput per placement: `python -m benchmarks.throughput +experiment=NAME [overrides] [options]`.

For each placement of `--placements` the experiment runs as its own `python -m hybridflow.run` (a free
rendezvous port each), the first `--warmup-steps` RL steps are dropped and `--steps` are timed. Written to
`--out`: <placement>.json per run, summary.json, table.md (placements compared, the cost model's prediction
next to each measurement, actor-update MFU and step time) and stage_times.png. `--variant NAME:OVERRIDES`
(repeatable) runs each placement once per variant, e.g. sequence packing off and on:

    python -m benchmarks.throughput +experiment=ppo_llama_1b_h200 --placements colocated \
        --variant padded: --variant "packed:roles.actor.max_tokens_per_micro_batch=8192 \
        roles.critic.max_tokens_per_micro_batch=8192"
 `--simulate` runs nothing: it predicts the same table with
the auto planner's cost model, and adds HybridFlow's evaluation setups (16-128 GPUs, 7B-70B) in
simulated.md / simulated.json.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

from benchmarks.placement_run import Sweep, run_name, run_placement, user_overrides
from benchmarks.provenance import REPO_ROOT, provenance
from benchmarks.report import measured_table, plot_stage_times, simulated_table, stage_table
from benchmarks.simulate import GPU_COUNTS, SIZES, simulate_grid
from hybridflow.config import split_argv
from hybridflow.errors import cli_errors
from hybridflow.resolve import resolve_experiment


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, str, list[str]]:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--placements", default="colocated,split",
                        help="comma-separated conf/placement names, each optionally NAME:ENGINE to pick the "
                             "rollout engine too, e.g. colocated:megatron,colocated:vllm, and @lagN for "
                             "trainer.rollout_lag=N, e.g. split_rollout,split_rollout@lag1 (default: colocated,split)")
    parser.add_argument("--warmup-steps", type=int, default=1, help="RL steps run first and not timed")
    parser.add_argument("--steps", type=int, default=3, help="RL steps timed after the warm-up")
    parser.add_argument("--out", type=Path, default=None, help="output dir (default benchmarks/results/...)")
    parser.add_argument("--simulate", action="store_true", help="predict with the cost model; run nothing")
    parser.add_argument("--simulate-sizes", default=",".join(SIZES), help="model sizes of the simulated grid")
    parser.add_argument("--simulate-gpus", default=",".join(map(str, GPU_COUNTS)), help="GPU counts of the grid")
    parser.add_argument("--run-timeout", type=float, default=1800.0, help="seconds one run may take")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME:OVERRIDES",
                        help="run every placement once per variant, with the variant's space-separated overrides "
                             "on top of the others (repeatable), e.g. --variant padded: --variant "
                             "'packed:roles.actor.max_tokens_per_micro_batch=8192'; rows are 'placement (NAME)'")
    args, rest = parser.parse_known_args(argv)
    unknown = [a for a in rest if a.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.steps < 1 or args.warmup_steps < 0:
        parser.error("--steps must be >= 1 and --warmup-steps >= 0")
    if any(":" not in v or not v.partition(":")[0] for v in args.variant):
        parser.error("--variant takes NAME:OVERRIDES (overrides may be empty: 'padded:')")
    experiment, overrides = split_argv(rest)
    return args, experiment, overrides


def variants(specs: list[str]) -> list[tuple[str, list[str]]]:
    """(name, overrides) per `--variant NAME:OVERRIDES`; one unnamed variant without overrides when none."""
    if not specs:
        return [("", [])]
    return [(name, overrides.split()) for name, _, overrides in (v.partition(":") for v in specs)]


def main(argv: list[str] | None = None) -> int:
    with cli_errors():
        args, experiment, overrides = parse_args(sys.argv[1:] if argv is None else argv)
        kept, dropped = user_overrides(overrides)
        cases = [(name, user_overrides(extra)) for name, extra in variants(args.variant)]
        dropped += [d for _, (_, variant_dropped) in cases for d in variant_dropped]
        for _, (extra, _) in cases:  # a bad key fails here, once, before any placement
            resolve_experiment(experiment, kept + extra)
        if dropped:
            print(f"note: the harness sets {', '.join(dropped)} itself; ignored", file=sys.stderr)
        meta = provenance()
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d_%H%M%S")
        out = args.out or REPO_ROOT / "benchmarks" / "results" / f"throughput_{experiment}_{stamp}"
        out.mkdir(parents=True, exist_ok=True)
        runs = []
        for placement in [p.strip() for p in args.placements.split(",") if p.strip()]:
            for name, (extra, _) in cases:
                label = f"{placement} ({name})" if name else placement
                sweep = Sweep(experiment, (*kept, *extra), args.warmup_steps, args.steps,
                              out / name if name else out, args.run_timeout)
                print(f"[benchmark] {experiment} placement={label} ...", file=sys.stderr, flush=True)
                run = {**run_placement(sweep, placement, args.simulate), **meta, "overrides": [*kept, *extra]}
                run |= {"placement": label, "variant": name} if name else {}
                stem = run_name(placement) + (f"_{name}" if name else "")
                (out / f"{stem}.json").write_text(json.dumps(run, indent=2))
                print(f"[benchmark] {label}: {run['status']} {run.get('reason', '')}", file=sys.stderr, flush=True)
                runs.append(run)
        title = f"# throughput: {experiment} ({meta['device']}, {meta['date']}, commit {meta['commit']})\n\n"
        table = title + measured_table(runs) + "\nstage seconds (mean per timed step):\n\n" + stage_table(runs)
        if args.simulate:
            grid = simulate_grid(args.simulate_sizes.split(","), [int(g) for g in args.simulate_gpus.split(",")])
            (out / "simulated.json").write_text(json.dumps(grid, indent=2))
            (out / "simulated.md").write_text("# cost-model predictions, HybridFlow setups (A100-80GB)\n\n"
                                              + simulated_table(grid))
        (out / "table.md").write_text(table)
        (out / "summary.json").write_text(json.dumps({"meta": meta, "runs": runs}, indent=2))
        plot_stage_times(runs, out / "stage_times.png")
        print(table)
        print(f"outputs in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
