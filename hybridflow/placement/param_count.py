"""The parameter count of one decoder layer, the figure the memory estimate, the cost model and the MFU
benchmarks all start from (one formula, so they cannot drift apart), and of its LoRA adapters.

A Llama-family layer: q and o projections `hidden x q_dim`, k and v `hidden x kv_dim`, and a SwiGLU MLP
(gate, up, down: `hidden x intermediate` each). Norm weights and biases are not matmul weights; callers
that hold them add them (they differ in whether they count them).
"""

from __future__ import annotations


def layer_matmul_params(hidden: int, intermediate: int, kv_dim: int, q_dim: int | None = None) -> int:
    """Matmul weights of one layer; `q_dim` (query heads x head_dim) defaults to `hidden`."""
    q_dim = hidden if q_dim is None else q_dim
    return 2 * hidden * q_dim + 2 * hidden * kv_dim + 3 * hidden * intermediate


def layer_lora_params(hidden: int, intermediate: int, kv_dim: int, q_dim: int, rank: int,
                      targets: tuple[str, ...] | list[str], tp: int) -> int:
    """LoRA adapter weights of one layer on one TP rank (megatron_adapters.lora's layout, one adapter per HF
    projection): a column-parallel base (qkv: q, k, v; fc1: gate, up) has one `A` [rank, hidden] per part,
    replicated, and `B` [out / tp, rank] sharded; a row-parallel base (proj, fc2) has `A` [rank, in / tp]
    sharded and `B` [hidden, rank] replicated. `targets`: the config's names (qkv, proj, fc1, fc2)."""
    per_target = {
        "qkv": 3 * rank * hidden + rank * (q_dim + 2 * kv_dim) // tp,
        "proj": rank * q_dim // tp + rank * hidden,
        "fc1": 2 * rank * hidden + 2 * rank * intermediate // tp,
        "fc2": rank * intermediate // tp + rank * hidden,
    }
    return sum(per_target[t] for t in targets)
