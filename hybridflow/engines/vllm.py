"""vLLM's record: one vLLM engine process per rollout rank (hybridflow.rollout.vllm_engine), fed by the
bridge through a staging buffer, sleeping between generations. GPU only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hybridflow.engines.record import DecodeTerms, EngineTraits, PackageRequirement, register_engine
from hybridflow.errors import UserError
from hybridflow.units import GIB

# The vLLM releases the engine supports (setup.py's [vllm] extra says the same; a test ties them).
VLLM_VERSIONS = ">=0.20,<0.35"
# Host memory of one engine process (Python, torch, vLLM, the CUDA runtime's host state): a round figure,
# not measured here.
VLLM_ENGINE_PROCESS_GIB = 4.0
# vLLM's decode step beyond the HBM stream and the per-layer launch term: a fixed host time per step (V1
# scheduler, sampling, detokenisation, the round trip to the engine process). Fitted 2026-12-04 to the two
# colocated vLLM runs of ppo_llama_1b_h200 on one H200 (64 prompts x 1, 1024 new tokens, TP 1;
# benchmarks/results/vllm_h200_20261204/ and vllm_engine_process_h200_20261204/: generation + sync 5.91 and
# 6.25 s, mean 6.08 s, where the model without it predicted 1.74 s) over their 1024 decode steps:
# (6.08 - 1.74) / 1024 = 4.24 ms. One shape only; other GPU types get it as an assumption.
VLLM_DECODE = {"vllm_decode_step_overhead_s": 4.24e-3}
VLLM_DECODE_SOURCE = ("fitted 2026-12-04 to ppo_llama_1b_h200 with rollout=vllm on one H200, two runs "
                      "(benchmarks/results/vllm_h200_20261204/, vllm_engine_process_h200_20261204/)")


@dataclass(frozen=True)
class VllmEngine:
    name: str = "vllm"
    builder: str = "hybridflow.rollout.vllm_engine:BUILDER"
    traits: EngineTraits = field(default_factory=lambda: EngineTraits(
        gpu_only=True, sleeps=True,
        # never run: it needs a rollout on GPUs of its own and no multi-GPU machine was there to verify it
        supports_rollout_lag=False,
        shares_actor_weights=False, replicates_kv_heads=True,
        # its log-probs cost ~15% of generation time (H200, 1B, 64 x 1024 tokens): the gate samples every 10th step
        logprobs_free=False, parity_every=10, separate_process=True,
        package=PackageRequirement("vllm", VLLM_VERSIONS, extra="vllm"),
        # merged by default: faster on one H100 at 135M (2.29 vs 2.45 s per step, parity alike); "adapters" loads
        # a PEFT directory per sync through vLLM's LoRA path (enable_lora, LoRARequest: rollout/vllm_engine.py)
        adapter_sync=("merged", "adapters")))

    def kv_cache_bytes(self, gpu_memory_utilization: float, gpu_memory_gib: float, weights: int,
                       batch_kv: int) -> int:
        """vLLM takes rollout.gpu_memory_utilization of the GPU and fills what its weights leave with KV cache."""
        budget = int(gpu_memory_utilization * gpu_memory_gib * GIB)
        if budget <= weights:
            raise UserError(
                f"rollout.gpu_memory_utilization: {gpu_memory_utilization} x "
                f"{gpu_memory_gib} GiB = {budget / GIB:.1f} GiB cannot hold the rollout weights "
                f"({weights / GIB:.1f} GiB per GPU); raise it or roles.rollout.parallel.tp"
            )
        return budget - weights

    def weights_on_host_while_sleeping(self, sleep_level: int) -> bool:
        """Sleep level 1 offloads the weights to host memory; level 2 drops them (the bridge rewrites them)."""
        return sleep_level == 1

    def process_host_bytes(self) -> int:
        return int(VLLM_ENGINE_PROCESS_GIB * GIB)

    def decode_terms(self, eff: Any, rows: int, hidden_size: int) -> DecodeTerms:
        """CUDA graphs with an assumed launch term per layer, plus the fitted host time per step (scheduler,
        sampling, the round trip to the engine process: VLLM_DECODE)."""
        return DecodeTerms(hbm_efficiency=eff.hbm_efficiency, layer_launch_s=eff.decode_layer_overhead_s,
                           step_host_s=eff.vllm_decode_step_overhead_s)


VLLM = register_engine(VllmEngine())
