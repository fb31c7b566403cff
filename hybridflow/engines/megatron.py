"""The native engine's record: KV-cache generation on the megatron-core model, inside the training process
(hybridflow.rollout.megatron_engine). The default, and the only engine on CPU."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.engines.record import DecodeTerms, EngineTraits, register_engine


@dataclass(frozen=True)
class MegatronEngine:
    name: str = "megatron"
    builder: str = "hybridflow.rollout.megatron_engine:BUILDER"
    traits: EngineTraits = field(default_factory=lambda: EngineTraits(
        gpu_only=False, sleeps=False, supports_rollout_lag=True, shares_actor_weights=True,
        replicates_kv_heads=False,  # megatron needs whole query groups per TP rank
        # its log-probs are a by-product of sampling, so the parity gate runs every step
        logprobs_free=True, parity_every=1, separate_process=False,
        adapter_sync=("adapters", "merged")))  # its model can be built with the actor's adapter spec

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
        """CUDA graphs of megatron-core forwards and eager sampling, fitted to measured steps (TP 1: device.py
        NATIVE_DECODE), so no separate launch term. The per-row term is not divided by the TP size: the fit
        cannot say how much of it is replicated work (norms, residuals, sampling)."""
        return DecodeTerms(hbm_efficiency=eff.native_decode_hbm_efficiency, layer_launch_s=0.0,
                           step_host_s=eff.native_decode_step_overhead_s
                           + rows * hidden_size * eff.native_decode_s_per_row_hidden)


MEGATRON = register_engine(MegatronEngine())
