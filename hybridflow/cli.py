"""`hybridflow <subcommand> [args]`: dispatch to `python -m hybridflow.<module>`'s main(argv)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

SUBCOMMANDS = {
    "plan": "hybridflow.plan",
    "run": "hybridflow.run",
    "convert": "hybridflow.convert",
    "check-env": "hybridflow.check_env",
    "sbatch": "hybridflow.sbatch",
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SUBCOMMANDS:
        print(f"usage: hybridflow {{{','.join(SUBCOMMANDS)}}} [--config FILE | -cd DIR -cn NAME | +experiment=NAME] "
              "[key=value ...]  (hybridflow SUBCOMMAND --help: its options)", file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(SUBCOMMANDS[argv[0]])
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
