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
from tests.placement.auto.paper_workload import LLAMA, VOCAB_SIZE


def paper_config(size: str, gpus: int, engine: str = "vllm") -> ExperimentConfig:
    cfg = ExperimentConfig(name=f"hybridflow_paper_{size}_{gpus}")
    cfg.model = ModelConfig(vocab_size=VOCAB_SIZE, max_position_embeddings=4096, **LLAMA[size])
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
    cfg.trainer.parity_max_abs = 2.0  # a gate for a bf16 engine, as the vLLM experiments set
    return finalize_experiment(cfg)


@pytest.fixture
def paper():
    """`paper(size, gpus)` -> the paper's setup as a finalized ExperimentConfig."""
    return paper_config
