"""GPU fast path: fused attention specs match the unfused local spec; the MFU benchmark runs (subprocesses,
so the CUDA context never lives in the pytest process that forks CPU ranks)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.gpu
def test_fused_specs_match_local_spec_in_bf16(tmp_path):
    out = tmp_path / "parity.json"
    subprocess.run(
        [sys.executable, str(ROOT / "tests/megatron_adapters/spec_parity_gpu.py"), str(out)],
        check=True,
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert result["sdpa"]["spec_name"] == "sdpa"
    for spec in ("sdpa", "auto"):
        # bf16 logits of a 2-layer model: kernels differ in rounding only
        assert result[spec]["max_abs_diff"] <= 0.05 * max(1.0, result[spec]["scale"]), result


@pytest.mark.gpu
def test_mfu_benchmark_quick_runs(tmp_path):
    out = tmp_path / "mfu.json"
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks/actor_mfu.py"), "--quick", "--json", str(out)],
        check=True,
        timeout=600,
    )
    result = json.loads(out.read_text())
    assert result["mfu"] > 0 and result["peak_memory_gib"] > 0
