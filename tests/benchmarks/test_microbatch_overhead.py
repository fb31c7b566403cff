"""benchmarks/microbatch_overhead.py: the overhead fit by hand, and a tiny CPU run through the real ModelRole path."""

import json
import subprocess
import sys

import pytest

from benchmarks.microbatch_overhead import overhead_fit
from tests.trainer.run_helpers import REPO


def test_overhead_is_the_intercept_of_the_two_smallest_sizes():
    # 3 ms + 0.5 ms per row at sizes 1 and 4; the compute-bound size 64 does not bend the line
    assert overhead_fit([(64, 100.0), (4, 5.0), (1, 3.5)]) == 3.0
    assert overhead_fit([(2, 7.0)]) == 7.0


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_tiny_cpu_run_times_every_size_and_counts_syncs(tmp_path):
    out = tmp_path / "overhead.json"
    subprocess.run([sys.executable, "benchmarks/microbatch_overhead.py", "--rows", "8", "--seq", "32",
                    "--prompt", "16", "--micro-batch-sizes", "1", "4", "--repeats", "1", "--json", str(out)],
                   cwd=REPO, check=True, capture_output=True, timeout=600)
    result = json.loads(out.read_text())
    sizes = result["micro_batch_sizes"]
    assert [r["micro_batch_size"] for r in sizes] == [1, 4] and [r["micro_batches"] for r in sizes] == [8, 2]
    for r in sizes:
        assert r["forward_ms"] > 0 and r["forward_backward_ms"] > 0 and r["optimizer_step_ms"] > 0
        # the update ends in an optimizer step whose gradient norm is a host read, and DDP reduces grads
        assert r["update_syncs"]["item_calls"] >= 1 and r["update_syncs"]["collectives"] >= 1
    # the default budget (16384 tokens) over 32-token rows takes all 8 rows in one forward micro-batch
    assert result["budgeted_forward"]["micro_batches"] == 1 and result["budgeted_forward"]["forward_pass_s"] > 0
    assert result["forward_overhead_ms"] == overhead_fit([(1, sizes[0]["forward_ms"]), (4, sizes[1]["forward_ms"])])


@pytest.mark.slow  # a process-level run: out of the default tier's 10 minutes
def test_profile_writes_a_gzipped_chrome_trace_per_pass_and_prints_the_top_ops(tmp_path):
    import gzip

    trace = tmp_path / "traces" / "tiny.json.gz"
    run = subprocess.run([sys.executable, "benchmarks/microbatch_overhead.py", "--rows", "4", "--seq", "16",
                          "--prompt", "8", "--micro-batch-sizes", "2", "--repeats", "1", "--profile",
                          "--trace", str(trace)], cwd=REPO, check=True, capture_output=True, text=True, timeout=600)
    for name in ("forward", "update"):
        path = tmp_path / "traces" / f"tiny.mbs2.{name}.json.gz"
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        assert any(e.get("name", "").startswith("aten::") for e in events), name
        assert f"{name}_syncs: 0 stream/device syncs, 0 D2H copies; top ops by self CPU time (trace {path})" \
            in run.stdout, run.stdout
    # the table lists ops with their call counts and self times
    assert any(line.strip().startswith("update_syncs aten::") and line.endswith(" ms")
               for line in run.stdout.splitlines()), run.stdout
