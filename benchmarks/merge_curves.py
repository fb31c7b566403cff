"""Several `benchmarks.trl_curve` outputs as one, for `benchmarks.time_to_accuracy`: seeds run in separate calls
(or beside each other on one GPU) and variants of a recipe set side by side under labels of their own.

    python -m benchmarks.merge_curves OUT LABEL=DIR[:SIDE[:SEEDS]][@shared] ...
    python -m benchmarks.time_to_accuracy OUT

Each source takes SIDE's runs (default `hybridflow-megatron`) from DIR/compare.json, all seeds or the listed
ones (`1,3`), and files them in OUT/compare.json under LABEL, copying each run's metrics.jsonl into
OUT/LABEL_s<seed>/. `@shared` marks runs that shared their GPU with other runs: their accuracy is theirs, their
seconds are not a solo run's (time_to_accuracy prints them marked).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from benchmarks.time_to_accuracy import read_compare
from hybridflow.errors import UserError, cli_errors

DEFAULT_SIDE = "hybridflow-megatron"


@dataclass(frozen=True)
class Source:
    label: str
    dir: Path
    side: str = DEFAULT_SIDE
    seeds: tuple[int, ...] | None = None
    shared_gpu: bool = False


def parse_source(spec: str) -> Source:
    """`LABEL=DIR[:SIDE[:SEEDS]][@shared]` as a Source; a malformed one is a UserError naming the form."""
    form = "LABEL=DIR[:SIDE[:SEEDS]][@shared], e.g. lora=/tmp/c_lora:hybridflow-megatron:2,3@shared"
    label, eq, rest = spec.partition("=")
    if not eq or not label or not rest:
        raise UserError(f"source {spec!r}: write it as {form}")
    shared = rest.endswith("@shared")
    parts = rest.removesuffix("@shared").split(":")
    if len(parts) > 3 or not parts[0]:
        raise UserError(f"source {spec!r}: write it as {form}")
    try:
        seeds = tuple(int(s) for s in parts[2].split(",")) if len(parts) == 3 else None
    except ValueError:
        raise UserError(f"source {spec!r}: SEEDS must be comma-separated integers ({form})") from None
    return Source(label, Path(parts[0]), parts[1] if len(parts) > 1 and parts[1] else DEFAULT_SIDE, seeds, shared)


def merge(sources: list[Source], out: Path) -> dict:
    """OUT/compare.json ({"meta", "runs"}) from `sources`, one run per seed holding every label of that seed."""
    runs: dict[int, dict] = {}
    metas, devices = [], []
    for src in sources:
        data = read_compare(src.dir)
        meta = data.get("meta", {})
        metas.append(f"{src.label}: {meta.get('commit', '?')} {meta.get('date', '?')}")
        devices.append(meta.get("device", "?"))
        found = [r for r in data["runs"] if src.side in r and (src.seeds is None or r["seed"] in src.seeds)]
        if not found:
            seeds = "" if src.seeds is None else f" of seeds {src.seeds}"
            raise UserError(f"{src.dir / 'compare.json'}: no {src.side} run{seeds}")
        for run in found:
            seed = run["seed"]
            if src.label in runs.get(seed, {}):
                raise UserError(f"{src.label}: seed {seed} given twice; pick seeds with DIR:SIDE:SEEDS")
            side = dict(run[src.side]) | ({"shared_gpu": True} if src.shared_gpu else {})
            runs.setdefault(seed, {"seed": seed, "work": run.get("work")})[src.label] = side
            metrics = src.dir / f"{src.side}_s{seed}" / "metrics.jsonl"
            if metrics.is_file():
                (out / f"{src.label}_s{seed}").mkdir(parents=True, exist_ok=True)
                shutil.copy(metrics, out / f"{src.label}_s{seed}" / "metrics.jsonl")
    merged = {"meta": {"sources": metas, "device": " / ".join(dict.fromkeys(devices)),
                       "date": "merged", "commit": "see sources"},
              "runs": [runs[s] for s in sorted(runs)]}
    (out / "compare.json").write_text(json.dumps(merged, indent=2))
    return merged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.merge_curves", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("sources", nargs="+", help="LABEL=DIR[:SIDE[:SEEDS]][@shared]")
    with cli_errors():
        args = parser.parse_args(sys.argv[1:] if argv is None else argv)
        sources = [parse_source(s) for s in args.sources]
        args.out.mkdir(parents=True, exist_ok=True)
        merged = merge(sources, args.out)
        print(f"wrote {args.out / 'compare.json'}: {len(merged['runs'])} seeds, labels "
              f"{sorted({k for r in merged['runs'] for k in r if k not in ('seed', 'work')})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
