"""Runs launcher scenarios in a process of its own (so a broken launcher cannot hang pytest).

`python tests/launch/launch_driver.py OUT_DIR` runs every scenario below and writes OUT_DIR/results.json:
{scenario: {"error": message or null, "error_type": ..., "result": ..., "out_dir": ...}}.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: hybridflow and tests

from hybridflow.launch import free_port, launch_local  # noqa: E402
from tests.launch.launch_fakes import fake_plan  # noqa: E402
from tests.launch.launch_workers import (  # noqa: E402
    DistCfg,
    all_reduce,
    one_rank_hangs,
    one_rank_raises,
    ranks_with_engines,
)

WORKERS_SCRIPT = str(Path(__file__).resolve().parent / "launch_workers.py")


def _scenarios(root: Path):
    """name -> (plan, entrypoint, args builder(out_dir, port), extra env, timeout_s)."""
    return {
        "all_reduce": (fake_plan(1, 3), all_reduce, lambda d, p: [d, p], {}, 60),
        "all_reduce_narrowed_gpus": (fake_plan(1, 2), all_reduce, lambda d, p: [d, p],
                                     {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}, 60),
        # A module path runs as `python -m module args` (how hybridflow.run re-enters itself per rank).
        "module_entrypoint": (fake_plan(1, 2), "launch_workers", lambda d, p: ["all_reduce", d, p],
                              {"PYTHONPATH": str(Path(__file__).resolve().parent)}, 60),
        "rank_killed": (fake_plan(1, 3), WORKERS_SCRIPT,
                        lambda d, p: ["one_rank_dies", d, p, 60, 1, "kill"], {}, 60),
        "rank_exits": (fake_plan(1, 3), WORKERS_SCRIPT,
                       lambda d, p: ["one_rank_dies", d, p, 60, 2, "exit"], {}, 60),
        "rank_raises": (fake_plan(1, 2), one_rank_raises, lambda d, p: [d, p, 60, 0], {}, 60),
        "rank_hangs": (fake_plan(1, 2), one_rank_hangs, lambda d, p: [d, p, 3, 1], {}, 3),
        # Run only when named: it never ends by itself (the test SIGKILLs this driver, the launcher).
        "ranks_with_engines": (fake_plan(1, 2), ranks_with_engines, lambda d, p: [d, p], {}, 60),
    }


ON_REQUEST = {"ranks_with_engines"}


def main(root: Path, only: list[str]) -> None:
    # Several ranks per device here, GPUs or not: the GPU path has its own test (test_local_launch_gpu.py).
    os.environ["HYBRIDFLOW_TEST_BACKEND"] = "gloo"
    results = {}
    for name, (plan, entry, make_args, env, timeout_s) in _scenarios(root).items():
        if (only and name not in only) or (not only and name in ON_REQUEST):
            continue
        out_dir = str(root / name)
        port = free_port()
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        record = {"out_dir": out_dir, "error": None, "error_type": None, "result": None, "port": port}
        try:
            dist_cfg = DistCfg(master_port=port, timeout_s=timeout_s)
            ret = launch_local(plan, entry, make_args(out_dir, port), dist_cfg, log_dir=root / name / "logs",
                               stop_grace_s=5)
            record["result"] = {str(k): v for k, v in ret.items()}
        except Exception as err:
            record["error"], record["error_type"] = str(err), type(err).__name__
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        results[name] = record
    (root / "results.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
