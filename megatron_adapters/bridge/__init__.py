"""Weight-resharding bridge: actor training shards (TP_t, PP_t, DP_t) -> rollout layout (TP_g, DP_g).

- ``plan``: ``ReshardPlan``, where each generation rank's weights come from, built from the placement Plan's
  actor and rollout meshes (placement owns the generation order: ``hybridflow.placement.generation``).
- ``shard_ranges`` / ``vllm_layout``: where each TP shard's rows sit; vLLM and native target names/shapes.
- ``schedule``: bucketed per-rank programs (gather / send / receive / copy).
- ``transport``: all-gather and point-to-point over torch.distributed groups.
- ``execute``: ``WeightBridge`` runs it; ``export``: offline ``export_vllm_shards``.
"""

from megatron_adapters.bridge.execute import ReshardStats, WeightBridge, training_shards
from megatron_adapters.bridge.plan import GenerationRank, ReshardPlan, build_reshard_plan, hybridflow_optimal_bytes
from megatron_adapters.bridge.shard_ranges import ShardGeometry, TargetFormat
from megatron_adapters.bridge.vllm_layout import bridge_tensors, hf_from_shards, shards_from_hf

__all__ = [
    "GenerationRank",
    "ReshardPlan",
    "ReshardStats",
    "ShardGeometry",
    "TargetFormat",
    "WeightBridge",
    "bridge_tensors",
    "build_reshard_plan",
    "hf_from_shards",
    "hybridflow_optimal_bytes",
    "shards_from_hf",
    "training_shards",
]
