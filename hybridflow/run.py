"""`python -m hybridflow.run +experiment=NAME [overrides]`: plan, check, launch the ranks, train.

Outside a launcher it starts one process per planned rank through PyTorch's elastic launcher; under
torchrun or srun it is one of those ranks already.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hybridflow.config import load_experiment, split_argv
from hybridflow.errors import cli_errors
from hybridflow.launch import LaunchError, detect_launcher, launch_local
from hybridflow.noise import quiet_known_noise
from hybridflow.placement import plan_placement
from hybridflow.placement.report import plan_summary
from hybridflow.trainer.preflight import preflight


def main(argv: list[str] | None = None) -> None:
    with cli_errors():
        experiment, overrides = split_argv(sys.argv[1:] if argv is None else argv)
        cfg = load_experiment(experiment, overrides)
        plan = plan_placement(cfg)
        notes = preflight(cfg, plan)
        if os.environ.get("RANK", "0") == "0":  # under torchrun/srun every rank runs this: say it once
            print(f"hybridflow run: experiment {cfg.name}\n  plan:   {plan_summary(plan)}\n"
                  f"  output: {Path(cfg.trainer.output_dir).resolve()}", *notes, sep="\n", flush=True)
        log_dir = Path(cfg.trainer.output_dir) / "logs"
        quiet_known_noise(log_dir=log_dir)
        # Imported only now: megatron-core's import-time warnings should not bury a bad-input message.
        from hybridflow.trainer.rank_main import rank_main

        if detect_launcher() is not None:
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
