"""trainer.profile_step: the profiled block's trace and per-stage table (hybridflow/trainer/profiling.py)."""

import gzip
import json

import torch

from hybridflow.trainer.profiling import profiled
from hybridflow.trainer.rl_step import StageTimer


def test_profiled_step_writes_a_trace_and_a_table_per_stage(tmp_path):
    timer = StageTimer()
    x = torch.randn(64, 64)
    with profiled(tmp_path / "profile", 3, 0):
        with timer("update_actor"):
            for _ in range(4):
                x = x @ x.T / 64
        with timer("ref"):
            float(x.sum())  # one host read
    table = (tmp_path / "profile" / "step3.rank0.txt").read_text()
    update = table.split("== update_actor:")[1].split("==")[0]
    ref = table.split("== ref:")[1].split("==")[0]
    assert "aten::mm" in update and "4 x" in update.split("aten::mm")[0].splitlines()[-1]
    assert ref.startswith(" ") and "1 host reads" in ref.splitlines()[0]
    assert "0 host reads" in update.splitlines()[0]
    with gzip.open(tmp_path / "profile" / "step3.rank0.json.gz", "rt") as f:
        names = {e.get("name") for e in json.load(f)["traceEvents"]}
    assert {"stage/update_actor", "stage/ref"} <= names
    assert timer.seconds.keys() == {"update_actor", "ref"}


def test_unprofiled_block_writes_nothing(tmp_path):
    with profiled(None, 1, 0):
        torch.ones(2).sum()
    assert not any(tmp_path.iterdir())
