"""The parameter count of one decoder layer, the figure the memory estimate, the cost model and the MFU
benchmarks all start from (one formula, so they cannot drift apart).

A Llama-family layer: q and o projections `hidden x q_dim`, k and v `hidden x kv_dim`, and a SwiGLU MLP
(gate, up, down: `hidden x intermediate` each). Norm weights and biases are not matmul weights; callers
that hold them add them (they differ in whether they count them).
"""

from __future__ import annotations


def layer_matmul_params(hidden: int, intermediate: int, kv_dim: int, q_dim: int | None = None) -> int:
    """Matmul weights of one layer; `q_dim` (query heads x head_dim) defaults to `hidden`."""
    q_dim = hidden if q_dim is None else q_dim
    return 2 * hidden * q_dim + 2 * hidden * kv_dim + 3 * hidden * intermediate
