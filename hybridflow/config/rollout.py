"""Rollout (generation) engine and sampling settings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLLOUT_ENGINES = ("megatron", "vllm")


@dataclass
class RolloutConfig:
    engine: str = "megatron"  # "megatron" (native, default on CPU) | "vllm"
    # Share of each GPU the engine may take for weights + KV cache (vLLM semantics). The native engine
    # sizes its KV cache for the batch instead and only uses this as an upper bound.
    gpu_memory_utilization: float = 0.5
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) = off
    n_samples_per_prompt: int = 1
    stop_token_ids: list[int] = field(default_factory=list)
    engine_args: dict[str, Any] = field(default_factory=dict)
    # vLLM sleep between generations: 1 frees the KV cache and offloads weights, 2 also drops the weights.
    sleep_level: int = 1
    dtype: str | None = None  # None = model.dtype
