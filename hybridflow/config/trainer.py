"""Training loop settings and torch.distributed rendezvous."""

from __future__ import annotations

from dataclasses import dataclass

from hybridflow.config.bounds import bounded

BACKENDS = ("auto", "nccl", "gloo")
LR_DECAY_STYLES = ("constant", "linear", "cosine")  # megatron OptimizerParamScheduler styles we expose


@dataclass
class TrainerConfig:
    total_steps: int = bounded(10, ge=0)
    seed: int = bounded(1234, ge=0)
    lr: float = bounded(1e-6, gt=0, lt=1)
    critic_lr: float | None = bounded(None, gt=0, lt=1)  # None = lr
    # The lr schedule of the trained roles (megatron's OptimizerParamScheduler), counted in optimizer steps
    # (ppo_epochs x mini-batches per RL step; the supervised warm-up runs at a constant sft_lr outside it): a linear
    # warm-up from 0
    # over lr_warmup_steps, then `lr_decay_style` from lr (critic_lr) down to min_lr at lr_decay_steps
    # (None = the RL run's optimizer steps). The default is a constant lr.
    lr_warmup_steps: int = bounded(0, ge=0)
    lr_decay_style: str = bounded("constant", choices=LR_DECAY_STYLES)
    lr_decay_steps: int | None = bounded(None, ge=1)
    min_lr: float = bounded(0.0, ge=0, lt=1)
    weight_decay: float = bounded(0.0, ge=0)
    grad_clip: float = bounded(1.0, ge=0)  # 0 = no clipping
    # supervised steps on the rows' 'answer' before RL; the result is the reference (with LoRA: the base stays it)
    warmup_sft_steps: int = bounded(0, ge=0)
    sft_lr: float | None = bounded(None, gt=0, lt=1)  # learning rate of the supervised warm-up; None = lr
    save_every: int = bounded(0, ge=0)  # every N RL steps, and always after the last; 0 = only the last
    # false: no checkpoint after the last step (with save_every 0: none at all, so the run cannot resume; the
    # final HF export is still written). For benchmarks, and for models whose checkpoint staging does not fit
    # host memory (the planner counts it: placement/host_memory.py).
    save_last: bool = True
    # "auto" (the newest complete checkpoint in output_dir) | "never" (start over) | a checkpoint directory
    resume: str = "auto"
    output_dir: str = "runs/${name}"
    val_every: int = bounded(0, ge=0)  # validate every N RL steps (and after the last); 0 = off
    val_before_train: bool = False  # validate once before the first RL step (after the SFT warm-up)
    val_temperature: float = bounded(0.0, ge=0)  # validation sampling temperature; 0 = greedy
    # Sample generations (prompt, response, reward) in <output_dir>/samples.jsonl and TensorBoard: the first
    # num_log_samples of every validation and of every log_samples_every-th RL step (0 = not in training).
    num_log_samples: int = bounded(4, ge=0)
    log_samples_every: int = bounded(10, ge=0)
    parity_max_abs: float = bounded(1e-4, gt=0)  # rollout vs actor log-prob parity gate (at rollout_lag=0)
    # The gate (off-policy figures at lag 1) runs on steps 0, N, 2N, ...; the rollout returns log-probs only on
    # those steps (and on every step with algorithm.tis_cap > 0). 0 = never; None = the engine's default
    # (its record's traits.parity_every, hybridflow.engines: 1 native, 10 vLLM).
    parity_every: int | None = bounded(None, ge=0)
    # 1: one-step-off asynchronous rollout (the rollout generates batch k+1 with the weights of step k-1 while
    # the actor trains on batch k); needs the rollout on GPUs the actor does not hold. 0: on-policy.
    rollout_lag: int = bounded(0, ge=0, le=1)
    # N > 0: torch.profiler over RL step N (1-based, as logged) on every rank: a Chrome trace and a per-stage op
    # table in <output_dir>/profile/ (hybridflow/trainer/profiling.py). 0 = off.
    profile_step: int = bounded(0, ge=0)
    # Every model role's log-probs and entropies through torch.compile'd kernels (megatron_adapters.logprobs): each
    # chunk reads the logits once instead of ~6 fp32 passes over [tokens, vocab]. Compiles on first use (CPU: a C++
    # compiler; ~1 min there), so off by default; grpo_smollm2 turns it on (an H100 step: ref 0.19 -> 0.15 s, update
    # 0.59 -> 0.45 s; benchmarks/README.md, 2026-12-07).
    compile_logprobs: bool = False


@dataclass
class DistributedConfig:
    master_addr: str = "127.0.0.1"
    master_port: int = bounded(29500, ge=1, le=65535)
    backend: str = bounded("auto", choices=BACKENDS)  # "auto": nccl with CUDA, gloo without
    timeout_s: int = bounded(300, ge=1)
