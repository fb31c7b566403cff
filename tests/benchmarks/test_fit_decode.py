"""benchmarks/fit_decode.py: the least-squares fit recovers figures it was given, and reads decode_roofline files."""

import json

import pytest

from benchmarks.fit_decode import DecodeFit, DecodePoint, fit, load_points

HBM = 4.8e12


def test_fit_recovers_the_figures_that_made_the_points():
    truth = DecodeFit(step_overhead_s=8e-4, hbm_efficiency=0.5, s_per_row_hidden=5e-9)
    points = []
    for weights, kv, rows in ((2.5e9, 1e9, 1.3e5), (2.5e9, 4e9, 5.2e5), (16e9, 2e9, 2.6e5), (16e9, 9e9, 1e6)):
        p = DecodePoint("x", 1, 1, 0.0, weights, kv, rows)
        points.append(DecodePoint("x", 1, 1, truth.step_s(p, HBM), weights, kv, rows))
    got = fit(points, HBM)
    assert got.step_overhead_s == pytest.approx(truth.step_overhead_s, rel=1e-6)
    assert got.hbm_efficiency == pytest.approx(truth.hbm_efficiency, rel=1e-6)
    assert got.s_per_row_hidden == pytest.approx(truth.s_per_row_hidden, rel=1e-6)


def test_points_take_the_mean_context_of_the_decode_steps(tmp_path):
    run = {"shape": "8b", "prompt": 100, "new_tokens": 50, "weight_bytes": 1000, "kv_bytes_per_token": 10,
           "rows": [{"batch": 4, "decode_ms_per_step": 2.0}]}
    path = tmp_path / "d.json"
    path.write_text(json.dumps(run))
    (p,) = load_points([path])
    assert p.step_s == 2e-3 and p.kv_bytes == 4 * 125 * 10 and p.row_hidden == 4 * 4096
    assert p.streamed_bytes == 1000 + 5000
