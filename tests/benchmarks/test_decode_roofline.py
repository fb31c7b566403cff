"""benchmarks/decode_roofline.py: the roofline formula by hand, and the CPU smoke run's output."""

import json
import subprocess
import sys

import pytest

from benchmarks.decode_roofline import decode_roofline_seconds, main
from tests.trainer.run_helpers import REPO


def test_roofline_streams_weights_and_the_growing_kv_cache_per_step():
    # 3 new tokens after a 10-token prompt: decode steps 2 and 3 attend over 11 and 12 cached tokens.
    weights, kv, batch, bandwidth = 1000, 10, 4, 100.0
    want = (2 * weights + batch * (11 + 12) * kv) / bandwidth
    assert decode_roofline_seconds(weights, kv, batch, prompt=10, new_tokens=3, bandwidth=bandwidth) == want


def test_an_unknown_sdpa_backend_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--quick", "--sdpa-backends", "default,fastest"])
    assert exit_info.value.code != 0
    assert "--sdpa-backends: 'fastest' is not a kernel" in capsys.readouterr().err


# Slow tier: decode time is full generation minus prefill, each timed, so a loaded machine can make it <= 0.
@pytest.mark.slow
def test_quick_run_writes_a_row_per_batch_and_backend(tmp_path):
    out = tmp_path / "decode.json"
    subprocess.run([sys.executable, "-m", "benchmarks.decode_roofline", "--quick", "--batches", "1,2",
                    "--sdpa-backends", "default,cudnn", "--json", str(out)],
                   cwd=REPO, check=True, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert [(row["batch"], row["sdpa_backend"]) for row in rows] == [(1, "default"), (1, "cudnn"), (2, "default"),
                                                                     (2, "cudnn")]
    timed = [row for row in rows if row["sdpa_backend"] == "default"]
    assert all(0 < row["decode_s"] < row["generate_s"] and row["fraction_of_roofline"] > 0 for row in timed)
    # cuDNN's kernel exists on CUDA only: on the CPU its rows carry the error instead of times
    assert all("No viable backend" in row["error"] for row in rows if row["sdpa_backend"] == "cudnn")
