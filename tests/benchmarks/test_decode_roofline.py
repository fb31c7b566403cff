"""benchmarks/decode_roofline.py: the roofline formula by hand, and the CPU smoke run's output."""

import json
import subprocess
import sys

import pytest

from benchmarks.decode_roofline import decode_roofline_seconds
from tests.trainer.run_helpers import REPO


def test_roofline_streams_weights_and_the_growing_kv_cache_per_step():
    # 3 new tokens after a 10-token prompt: decode steps 2 and 3 attend over 11 and 12 cached tokens.
    weights, kv, batch, bandwidth = 1000, 10, 4, 100.0
    want = (2 * weights + batch * (11 + 12) * kv) / bandwidth
    assert decode_roofline_seconds(weights, kv, batch, prompt=10, new_tokens=3, bandwidth=bandwidth) == want


# Slow tier: decode time is full generation minus prefill, each timed, so a loaded machine can make it <= 0.
@pytest.mark.slow
def test_quick_run_writes_a_row_per_batch(tmp_path):
    out = tmp_path / "decode.json"
    subprocess.run([sys.executable, "-m", "benchmarks.decode_roofline", "--quick", "--batches", "1,2",
                    "--json", str(out)], cwd=REPO, check=True, capture_output=True, timeout=300)
    result = json.loads(out.read_text())
    assert [row["batch"] for row in result["rows"]] == [1, 2]
    assert all(0 < row["decode_s"] < row["generate_s"] and row["fraction_of_roofline"] > 0 for row in result["rows"])
