"""Auto-placement test setup: HybridFlow's evaluation (EuroSys'25 section 8.1) as an `ExperimentConfig`.

Llama 2 7B/13B/70B and Code Llama 34B shapes for every role; 16 machines x 8 A100-80GB, NVLink 600 GB/s
(300 GB/s each way) inside a machine, 200 Gbps between machines (25 GB/s per machine = 3.125 GB/s per GPU);
prompt and response 1024 tokens, 1024 prompts per iteration. Not stated by the paper, so set as verl's
defaults: 256 samples per PPO mini-batch, one PPO epoch, micro-batch 1; a vLLM rollout holding 30 % of
each GPU (weights + KV cache), so four colocated models still fit 16 GPUs.
"""

from __future__ import annotations

import pytest

from hybridflow.config import ExperimentConfig, ModelConfig
from hybridflow.config.cluster import ClusterConfig
from hybridflow.config.experiment import finalize_experiment

LLAMA = {
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=32),
    "13b": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=40, num_attention_heads=40,
                num_key_value_heads=40),
    "34b": dict(hidden_size=8192, intermediate_size=22016, num_hidden_layers=48, num_attention_heads=64,
                num_key_value_heads=8),
    "70b": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8),
}


def paper_config(size: str, gpus: int, engine: str = "vllm") -> ExperimentConfig:
    cfg = ExperimentConfig(name=f"hybridflow_paper_{size}_{gpus}")
    cfg.model = ModelConfig(vocab_size=32000, max_position_embeddings=4096, **LLAMA[size])
    cfg.cluster = ClusterConfig(nodes=gpus // 8, gpus_per_node=8, gpu_type="A100", inter_node_gbps=25 / 8)
    cfg.placement.mode = "auto"
    cfg.rollout.engine = engine
    cfg.rollout.gpu_memory_utilization = 0.3
    cfg.rollout.max_new_tokens = 1024
    cfg.data.max_prompt_length = 1024
    cfg.data.seq_length = 2048
    cfg.data.train_batch_size = 1024
    cfg.algorithm.mini_batch_size = 256
    cfg.roles.reward.enabled = True
    cfg.reward.use_model = True
    cfg.reward.fn = None
    return finalize_experiment(cfg)


@pytest.fixture
def paper():
    """`paper(size, gpus)` -> the paper's setup as a finalized ExperimentConfig."""
    return paper_config
