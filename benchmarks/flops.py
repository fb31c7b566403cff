"""Model FLOPs of the PPO actor update and the MFU they give.

    FLOPs per update = ppo_epochs * T * (6 * N + 12 * L * h * S)

T: the step's tokens (prompt + response, padding not counted), S: their mean length per sample, N: the
matmul weights (q, k, v, o and gate, up, down of every layer, plus the lm head; the embedding lookup and
the norms are not matmuls), L: layers, h: hidden size. 6 * N is forward (2 N) plus backward (4 N); 12 * L * h * S
is QK^T and AV (2 * 2 * h * S per layer and token forward, times 3 with the backward), counted over the
full sequence as PaLM's MFU does (no causal halving). Model FLOPs, not hardware FLOPs: activation
recomputation is not counted.

    MFU = FLOPs per update / (update seconds * actor GPUs * bf16 peak FLOP/s per GPU)
"""

from __future__ import annotations

from hybridflow.config import ModelConfig
from hybridflow.placement.auto.from_config import model_shape


def actor_update_flops(model: ModelConfig, tokens: float, mean_seq_len: float, ppo_epochs: int) -> float:
    """Model FLOPs of `ppo_epochs` forward+backward passes over `tokens` tokens (see the module docstring):
    3x the planner's forward FLOPs, attending over the full mean length (PaLM's convention)."""
    return ppo_epochs * tokens * 3 * model_shape(model, "actor").forward_flops_per_token(mean_seq_len)


def mfu(flops: float, seconds: float, gpus: int, peak_tflops: float) -> float:
    """Share of the peak the update reached; 0 when nothing was timed."""
    if seconds <= 0 or gpus <= 0 or peak_tflops <= 0:
        return 0.0
    return flops / (seconds * gpus * peak_tflops * 1e12)
