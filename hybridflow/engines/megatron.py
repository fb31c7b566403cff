"""The native engine's record: KV-cache generation on the megatron-core model, inside the training process
(hybridflow.rollout.megatron_engine). The default, and the only engine on CPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.engines.record import DecodeTerms, EngineTraits, register_engine

# The native rollout's decode step (rollout.engine=megatron: CUDA graphs of a megatron-core GPTModel forward,
# eager fp32 sampling and bookkeeping in between) as fixed seconds + streamed bytes at a share of the HBM
# datasheet + seconds per batch row and hidden unit (work per row that grows with the model's width). Fitted
# 2026-12-03 by benchmarks/fit_decode.py to 14 points measured on one H200 (TP 1;
# benchmarks/results/calibrate_h200_20261203/decode{1b,8b}*.json, two runs): Llama-3.2-1B and Llama-3-8B
# shapes, prompts 128 and 1024, batches 32-256, 3.3-15.6 ms per step, every point within 9 %; a held-out
# third shape (Qwen2-7B's dimensions, vocabulary 152k) lands within 9 % too. A per-row term in batch x vocab
# fitted worse (19 %). Other GPU types get the same figures as an assumption (`MEASURED` in
# hybridflow/placement/auto/device.py marks them measured on H200 only).
NATIVE_DECODE = {"native_decode_hbm_efficiency": 0.639, "native_decode_step_overhead_s": 1.57e-3,
                 "native_decode_s_per_row_hidden": 5.09e-9}
NATIVE_DECODE_SOURCE = ("fitted 2026-12-03 by benchmarks/fit_decode.py to native decode on one H200 (TP 1), "
                        "1B and 8B shapes, 14 points within 9 %, a held-out Qwen2-7B shape within 9 % "
                        "(benchmarks/results/calibrate_h200_20261203/)")


@dataclass(frozen=True)
class MegatronEngine:
    name: str = "megatron"
    builder: str = "hybridflow.rollout.megatron_engine:BUILDER"
    traits: EngineTraits = field(default_factory=lambda: EngineTraits(
        gpu_only=False, sleeps=False, supports_rollout_lag=True, shares_actor_weights=True,
        replicates_kv_heads=False,  # megatron needs whole query groups per TP rank
        # its log-probs are a by-product of sampling, so the parity gate runs every step
        logprobs_free=True, parity_every=1, separate_process=False,
        # adapters first: the engine runs the actor's own adapter modules, so its log-probs stay the trainer's (one
        # H100, 135M: parity 2.4e-6; merged W + sBA decodes 14 % faster but rounds to 0.035 mean in bf16)
        adapter_sync=("adapters", "merged"), trainer_kernels=True))

    def kv_cache_bytes(self, gpu_memory_utilization: float, gpu_memory_gib: float, weights: int,
                       batch_kv: int) -> int:
        """The native engine sizes its cache for the replica's batch (rollout.gpu_memory_utilization is only
        an upper bound it never reaches in the estimate)."""
        return batch_kv

    def weights_on_host_while_sleeping(self, sleep_level: int) -> bool:
        return False

    def process_host_bytes(self) -> int:
        return 0

    def decode_terms(self, eff: Any, rows: int, hidden_size: int) -> DecodeTerms:
        """CUDA graphs of megatron-core forwards and eager sampling, fitted to measured steps (TP 1:
        NATIVE_DECODE, the cost model's Efficiency defaults), so no separate launch term. The per-row term is
        not divided by the TP size: the fit cannot say how much of it is replicated work (norms, residuals,
        sampling)."""
        return DecodeTerms(hbm_efficiency=eff.native_decode_hbm_efficiency, layer_launch_s=0.0,
                           step_host_s=eff.native_decode_step_overhead_s
                           + rows * hidden_size * eff.native_decode_s_per_row_hidden)


MEGATRON = register_engine(MegatronEngine())
