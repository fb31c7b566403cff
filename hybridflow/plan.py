"""`python -m hybridflow.plan +experiment=NAME [key=value ...] [--out PATH]`: print the placement plan and
per-GPU memory table and the predicted step time (the auto search's cost model, also for explicit plans),
write it as JSON (default ./plan.json), and print the command that runs it. Needs no GPU."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from hybridflow.algorithms import check_algorithm
from hybridflow.errors import UserError, cli_errors
from hybridflow.experiment import Experiment
from hybridflow.launch.command_help import (
    config_parser,
    config_source,
    job_config_yaml,
    parse_config_args,
    source_args,
)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = config_parser("python -m hybridflow.plan", __doc__)
    parser.add_argument("--out", default="plan.json", help="where to write the plan as JSON (default ./plan.json)")
    return parse_config_args(parser, argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with cli_errors():
        experiment = Experiment.load(*config_source(args))
        if args.cfg:
            check_algorithm(experiment.config)
            print(job_config_yaml(experiment.config), end="")
            return 0
        report = experiment.plan()
        out = Path(args.out).resolve()
        _write_json(out, report.to_json())
    print(report.format())
    print(f"wrote {out}")
    print("next: " + shlex.join(["python", "-m", "hybridflow.run", *source_args(args)]))
    return 0


def _write_json(out: Path, record: dict) -> None:
    """Write `record` at `out` (the `--out` file), making its directory; UserError naming --out if it can't."""
    if out.is_dir():
        raise UserError(f"--out: {out} is a directory; give a file path such as {out / 'plan.json'}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1))
    except OSError as err:
        raise UserError(f"--out: cannot write {out} ({err.strerror or err}); give a path in a writable directory"
                        ) from None


if __name__ == "__main__":
    raise SystemExit(main())
