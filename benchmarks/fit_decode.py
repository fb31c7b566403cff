"""Fit the native rollout's decode-step figures of the cost model to `decode_roofline` runs.

    python -m benchmarks.fit_decode benchmarks/results/calibrate_h200_20261203/decode{1b,8b}*.json

A decode step of the native engine is modelled (placement/auto/cost_model.py) as

    seconds = step_overhead + (weight bytes + batch * context * KV bytes per token) / (HBM peak * efficiency)
              + batch * hidden size * seconds per row and hidden unit

(the fixed part: graph launch and the eager bookkeeping between steps; the streamed part; work per row that
grows with the model's width, e.g. every layer's elementwise kernels and the GEMMs' batch dimension). Each row
of each file is one (shape, prompt, batch) point with its mean ms per decode step; the three figures come
from a least-squares fit over the points given, and the per-point error says how well one set of figures
covers the shapes measured. On the H200 runs a per-row term in batch x vocabulary fitted worse and, next to
this one, came out negative (benchmarks/results/calibrate_h200_20261203/README.md).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.actor_mfu import SHAPES


@dataclass(frozen=True)
class DecodePoint:
    shape: str
    batch: int
    prompt: int
    step_s: float
    weight_bytes: float
    kv_bytes: float  # the batch's KV cache at the mean context of the decode steps
    row_hidden: float  # batch * hidden size

    @property
    def streamed_bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes


@dataclass(frozen=True)
class DecodeFit:
    step_overhead_s: float
    hbm_efficiency: float
    s_per_row_hidden: float

    def step_s(self, p: DecodePoint, hbm_bytes_per_s: float) -> float:
        return (self.step_overhead_s + p.streamed_bytes / (hbm_bytes_per_s * self.hbm_efficiency)
                + p.row_hidden * self.s_per_row_hidden)


def load_points(paths: list[Path]) -> list[DecodePoint]:
    """One point per row of every `decode_roofline --json` file."""
    points = []
    for path in paths:
        run = json.loads(path.read_text())
        hidden = SHAPES[run["shape"]]["hidden_size"]
        prompt, new = run["prompt"], run["new_tokens"]
        # decode step j = 1 .. new - 1 attends over prompt + j tokens (decode_roofline_seconds)
        context = prompt + new / 2
        for row in run["rows"]:
            points.append(DecodePoint(run["shape"], row["batch"], prompt, row["decode_ms_per_step"] / 1e3,
                                      run["weight_bytes"], row["batch"] * context * run["kv_bytes_per_token"],
                                      row["batch"] * hidden))
    return points


def fit(points: list[DecodePoint], hbm_bytes_per_s: float) -> DecodeFit:
    """Least squares of step seconds on (1, streamed bytes, batch x hidden)."""
    a = torch.tensor([[1.0, p.streamed_bytes, p.row_hidden] for p in points], dtype=torch.float64)
    y = torch.tensor([p.step_s for p in points], dtype=torch.float64)
    scale = a.abs().amax(dim=0)  # columns differ by ~1e10: solve on unit-scaled columns
    coef = torch.linalg.lstsq(a / scale, y.unsqueeze(1)).solution.squeeze(1) / scale
    overhead, per_byte, per_row_hidden = coef.tolist()
    return DecodeFit(overhead, 1.0 / (per_byte * hbm_bytes_per_s), per_row_hidden)


def main(argv=None) -> DecodeFit:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="decode_roofline --json outputs")
    parser.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM datasheet TB/s (default H200's 4.8)")
    args = parser.parse_args(argv)
    hbm = args.hbm_tbps * 1e12
    points = load_points(args.files)
    result = fit(points, hbm)
    print(f"step_overhead_s {result.step_overhead_s:.3e}  hbm_efficiency {result.hbm_efficiency:.3f}  "
          f"s_per_row_hidden {result.s_per_row_hidden:.3e}")
    for p in points:
        model = result.step_s(p, hbm)
        print(f"  {p.shape:>4} prompt {p.prompt:>4} batch {p.batch:>3}: measured {p.step_s * 1e3:6.2f} ms, "
              f"fit {model * 1e3:6.2f} ms ({(model - p.step_s) / p.step_s:+.1%})")
    return result


if __name__ == "__main__":
    main()
