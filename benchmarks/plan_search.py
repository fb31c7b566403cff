"""Time the auto-placement search (HybridFlow Algorithm 1) on 16 x 8 A100 with 4 roles (actor, critic, ref,
reward), HybridFlow's evaluation setup, for each Llama size. Needs no GPU.

    python benchmarks/plan_search.py [--repeat 3] [--gpus 128]

Prints, per model size: the chosen placement, the predicted iteration time, the wall time of the search
(cold: a fresh search, nothing cached across runs) and how much it enumerated.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "placement" / "auto"))

from conftest import paper_config  # noqa: E402  (the paper's setup, shared with the tests)

from hybridflow.placement.auto import explain, search_config  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--gpus", type=int, default=128)
    args = parser.parse_args(argv)
    print(f"auto placement search, {args.gpus} x A100-80GB, 4 roles, best of {args.repeat}")
    for size in ("7b", "13b", "34b", "70b"):
        cfg = paper_config(size, args.gpus)
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            result = search_config(cfg)
            times.append(time.perf_counter() - start)
        ex = explain(result)
        stats = ", ".join(f"{k}={v}" for k, v in result.stats.items())
        print(f"{size:>4}: search {min(times):.3f} s (max {max(times):.3f} s)  chosen {ex.chosen}  "
              f"predicted {ex.total_s:.1f} s/iter  [{stats}]")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
