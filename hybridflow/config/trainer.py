"""Training loop settings and torch.distributed rendezvous."""

from __future__ import annotations

from dataclasses import dataclass

BACKENDS = ("auto", "nccl", "gloo")


@dataclass
class TrainerConfig:
    total_steps: int = 10
    seed: int = 1234
    lr: float = 1e-6
    critic_lr: float | None = None  # None = lr
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    warmup_sft_steps: int = 0
    sft_lr: float | None = None  # learning rate of the supervised warm-up; None = lr
    save_every: int = 0  # 0 = only at the end
    resume: str = "auto"  # "auto" | "never" | path to a checkpoint dir
    output_dir: str = "runs/${name}"
    parity_max_abs: float = 1e-4  # rollout vs actor log-prob parity gate


@dataclass
class DistributedConfig:
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "auto"  # "auto" (nccl with CUDA, gloo without) | "nccl" | "gloo"
    timeout_s: int = 300
