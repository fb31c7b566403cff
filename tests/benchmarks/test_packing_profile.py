"""benchmarks/packing_profile.py: the synthetic rows by hand, and the tiny CPU run end to end."""

import json
import math
import subprocess
import sys

import pytest
import torch

from benchmarks.packing_profile import synthetic_rows
from tests.trainer.run_helpers import REPO


def test_synthetic_rows_are_right_padded_with_lengths_in_range():
    rows = synthetic_rows(rows=50, width=40, min_fraction=0.9, vocab=7, seed=0)
    lens = rows["seq_lens"]
    assert lens.min() >= 36 and lens.max() <= 40
    columns = torch.arange(40)[None, :]
    after_end = columns >= lens[:, None]
    assert (rows["input_ids"][after_end] == 0).all()
    # the "prompt" is each row's first 16 tokens; the response runs to the row's end
    assert (rows["loss_mask"].sum(1) == lens - 16).all()
    assert rows["loss_mask"][:, :16].sum() == 0


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_tiny_cpu_run_times_every_variant_and_packed_matches_padded(tmp_path):
    subprocess.run([sys.executable, "benchmarks/packing_profile.py", "--device", "cpu", "--tiny",
                    "--out", str(tmp_path)], cwd=REPO, check=True, capture_output=True, timeout=120)
    result = json.loads((tmp_path / "profile.json").read_text())
    runs = {(r["variant"], r["mode"]): r for r in result["runs"]}
    assert set(runs) == {(v, m) for v in ("padded", "packed96", "packed160") for m in ("forward", "train")}
    real = result["rows"]["real_tokens"]
    assert 0 < result["rows"]["padding_fraction"] < 0.1
    for (variant, _), run in runs.items():
        assert run["seconds"] > 0 and run["tokens_per_s"] == real / run["seconds"]
        if variant == "padded":
            assert run["micro_batches"] == math.ceil(6 / 2)
        else:  # whole samples under the budget: at least ceil(tokens / budget) bins, at most one per row
            assert math.ceil(real / run["budget"]) <= run["micro_batches"] <= 6
        # fp32 on CPU: packing changes only the summation order inside attention
        assert run["max_abs_logprob_diff_vs_padded"] < 1e-4
        assert "Self CPU time total" in run["profile"]["cpu"]
    markdown = (tmp_path / "profile.md").read_text()
    assert "| packed160 | train |" in markdown and "top cpu ops" in markdown
