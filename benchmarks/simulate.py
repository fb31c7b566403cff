"""`--simulate`: predicted figures for HybridFlow's evaluation setups (EuroSys'25 section 8.1), which we
cannot run: Llama-2 7B/13B/70B and Code Llama 34B shapes for actor, critic, reference and reward model,
16 to 128 A100-80GB GPUs (8 per machine), 1024 prompts of 1024 tokens with 1024-token responses, vLLM
rollout. Figures the paper leaves open are set as in the auto planner's tests (mini-batch 256, one PPO
epoch, micro-batch 1, rollout at 30 % of GPU memory).
"""

from __future__ import annotations

import time

from benchmarks.predict import predict_candidate, predict_plan
from hybridflow.config import ExperimentConfig, ModelConfig, finalize_experiment
from hybridflow.config.cluster import ClusterConfig
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement
from hybridflow.placement.auto import search_config
from hybridflow.placement.auto.explain import describe_sets

SIZES = ("7b", "13b", "34b", "70b")
GPU_COUNTS = (16, 32, 64, 128)
# 200 Gbps per machine between machines = 25 GB/s per machine, shared by its 8 GPUs.
INTER_NODE_GBPS_PER_GPU = 25 / 8
# Llama 2 (7B, 13B, 70B) and Code Llama 34B: (hidden, intermediate, layers, heads, kv heads); vocabulary 32000.
LLAMA_SHAPES = {"7b": (4096, 11008, 32, 32, 32), "13b": (5120, 13824, 40, 40, 40), "34b": (8192, 22016, 48, 64, 8),
                "70b": (8192, 28672, 80, 64, 8)}


def hybridflow_setup(size: str, gpus: int) -> ExperimentConfig:
    """One of the paper's setups as an auto-placed ExperimentConfig."""
    hidden, intermediate, layers, heads, kv_heads = LLAMA_SHAPES[size]
    cfg = ExperimentConfig(name=f"hybridflow_{size}_{gpus}gpu")
    cfg.model = ModelConfig(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                            num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=32000,
                            max_position_embeddings=4096)
    cfg.cluster = ClusterConfig(nodes=gpus // 8, gpus_per_node=8, gpu_type="A100",
                                inter_node_gbps=INTER_NODE_GBPS_PER_GPU)
    cfg.placement.mode = "auto"
    cfg.rollout.engine = "vllm"
    cfg.rollout.gpu_memory_utilization = 0.3
    cfg.rollout.max_new_tokens = 1024
    cfg.data.max_prompt_length, cfg.data.seq_length, cfg.data.train_batch_size = 1024, 2048, 1024
    cfg.algorithm.mini_batch_size = 256
    cfg.roles.reward.enabled, cfg.reward.use_model, cfg.reward.fn = True, True, None
    cfg.trainer.parity_max_abs = 2.0  # a gate for a bf16 engine, as the vLLM experiments set
    return finalize_experiment(cfg)


def simulate_setup(cfg: ExperimentConfig, top: int = 3) -> list[dict]:
    """The searched best placement and the best of up to `top - 1` other colocation partitions."""
    start = time.perf_counter()
    result = search_config(cfg)
    search_s = time.perf_counter() - start
    rows = []
    for i, part in enumerate(p for p in result.partitions if p.best is not None):
        if i >= top:
            break
        row = {"setup": cfg.name, "placement": describe_sets(part.best), "chosen": part.best is result.chosen,
               "gpus": result.world_size, "search_s": search_s, **predict_candidate(cfg, part.best, result.world_size)}
        rows.append(row)
    return rows


def simulate_grid(sizes=SIZES, gpu_counts=GPU_COUNTS, top: int = 3) -> list[dict]:
    """Predictions for every (size, GPU count) setup; a setup that fits nowhere is a row with its reason."""
    rows = []
    for size in sizes:
        for gpus in gpu_counts:
            cfg = hybridflow_setup(size, gpus)
            try:
                rows += simulate_setup(cfg, top)
            except UserError as err:
                rows.append({"setup": cfg.name, "gpus": gpus, "skipped": str(err).splitlines()[0]})
    return rows


def predict_experiment(cfg: ExperimentConfig) -> dict:
    """The cost model's figures for one experiment and placement (explicit: its layouts; auto: the search)."""
    plan = plan_placement(cfg)
    return predict_plan(cfg, plan)

