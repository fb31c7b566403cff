"""Checks that run before any process starts or any file is written, so bad input costs one line."""

from __future__ import annotations

from pathlib import Path

import torch

from hybridflow.config import ExperimentConfig
from hybridflow.data import load_prompt_dataset, load_tokenizer
from hybridflow.errors import UserError
from hybridflow.placement import Plan
from hybridflow.rewards import resolve_reward_fn


def preflight(cfg: ExperimentConfig, plan: Plan) -> None:
    """Data, tokenizer, reward function and devices are usable; raises UserError naming the field."""
    if cfg.cluster.gpu_type != "cpu":
        have = torch.cuda.device_count()
        if have < plan.gpus_per_node:
            raise UserError(
                f"cluster.gpus_per_node: the experiment needs {plan.gpus_per_node} GPUs per node, this machine "
                f"has {have}; run on a machine with them or use +experiment=tiny_cpu"
            )
    load_prompt_dataset(cfg.data.source, cfg.data.prompt_key, seed=cfg.trainer.seed)
    if cfg.data.tokenizer is not None:
        if not Path(cfg.data.tokenizer).is_dir():
            raise UserError(f"data.tokenizer: {cfg.data.tokenizer!r} is not a directory; point it at a local "
                            "HF tokenizer")
        load_tokenizer(cfg.data.tokenizer)
    if not cfg.reward.use_model:
        resolve_reward_fn(cfg.reward.fn, cfg.data.source)
