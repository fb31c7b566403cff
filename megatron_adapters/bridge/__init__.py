"""Weight-resharding bridge: actor training shards (TP_t, PP_t, DP_t) -> rollout layout (TP_g, DP_g).

- ``ReshardPlan`` (HybridFlow zero-redundancy grouping, split placement) lives in
  ``hybridflow.placement.reshard_plan``: the placement plan owns the rollout's generation order.
- ``shard_ranges`` / ``vllm_layout``: where each TP shard's rows sit; vLLM and native target names/shapes.
- ``schedule``: bucketed per-rank programs (gather / send / receive / copy).
- ``transport``: all-gather and point-to-point over torch.distributed groups.
- ``execute``: ``WeightBridge`` runs it; ``export``: offline ``export_vllm_shards``.
"""

from hybridflow.placement.reshard_plan import (
    GenerationLayout,
    ReshardPlan,
    TrainingLayout,
    build_reshard_plan,
    hybridflow_optimal_bytes,
)
from megatron_adapters.bridge.execute import ReshardStats, WeightBridge, training_shards
from megatron_adapters.bridge.shard_ranges import ShardGeometry, TargetFormat
from megatron_adapters.bridge.vllm_layout import bridge_tensors, hf_from_shards, shards_from_hf

__all__ = [
    "GenerationLayout",
    "ReshardPlan",
    "ReshardStats",
    "ShardGeometry",
    "TargetFormat",
    "TrainingLayout",
    "WeightBridge",
    "bridge_tensors",
    "build_reshard_plan",
    "hf_from_shards",
    "hybridflow_optimal_bytes",
    "shards_from_hf",
    "training_shards",
]
