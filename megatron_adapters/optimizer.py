"""megatron-core DDP + (distributed) Adam optimizer + gradient clipping for one trainable role.

`wrap_for_training` wraps a role's model chunks in megatron-core `DistributedDataParallel` (gradient buffers,
DP reduce-scatter / all-reduce over the role's own dp group) and points the model config's grad-sync hooks
at them, so `forward_backward.run_forward_backward` finalises gradients the way megatron's training loop does.
`build_optimizer` makes megatron-core's optimizer over those chunks (distributed optimizer by default: Adam
state and fp32 main params sharded over DP). `TrainingPrecision` picks bf16 on GPU and fp32 on CPU.

A step: `role_optimizer.zero_grad()` (also zeroes the DDP grad buffers), `run_forward_backward(...)`, then
`role_optimizer.step()`, which clips by the global grad norm (`grad_clip`), updates (with the distributed
optimizer: the local shard, then all-gathers the params) and advances megatron's lr/wd scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.optimizer import (
    MegatronOptimizer,
    OptimizerConfig,
    get_megatron_optimizer,
    get_standard_config_overrides,
)
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.utils import get_model_config

from megatron_adapters.optimizer_sync import fuse_torch_adam, install_sync_free_grad_norm


@dataclass(frozen=True)
class TrainingPrecision:
    """Parameter dtype of a trained model and whether megatron's bf16 optimizer path is used."""

    params_dtype: torch.dtype
    bf16: bool

    @staticmethod
    def default() -> TrainingPrecision:
        """bf16 weights with fp32 main params and grads on GPU; plain fp32 on CPU (no fast bf16 matmuls)."""
        if torch.cuda.is_available():
            return TrainingPrecision(torch.bfloat16, bf16=True)
        return TrainingPrecision(torch.float32, bf16=False)

    @staticmethod
    def from_name(name: str) -> TrainingPrecision:
        """ "bf16" | "fp32" (the config's `model.dtype`)."""
        if name == "bf16":
            return TrainingPrecision(torch.bfloat16, bf16=True)
        if name == "fp32":
            return TrainingPrecision(torch.float32, bf16=False)
        raise ValueError(f"dtype: {name!r} is not supported; use 'bf16' or 'fp32'")


@dataclass(frozen=True)
class OptimizerSettings:
    """The knobs a role's optimizer takes from the experiment config (trainer.lr, weight_decay, grad_clip)."""

    lr: float
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    adam_eps: float = 1e-8
    use_distributed_optimizer: bool = True
    lr_warmup_steps: int = 0
    # megatron's OptimizerParamScheduler styles: constant, linear, cosine, inverse-square-root, WSD.
    lr_decay_style: str = "constant"
    lr_decay_steps: int = 1  # steps until min_lr for non-constant styles; must exceed lr_warmup_steps
    min_lr: float = 0.0
    # `roles.<role>.offload_optimizer`: megatron's HybridDeviceOptimizer keeps the fp32 main params and Adam
    # states in host memory and steps there (torch AdamW on CPU). Needs the distributed optimizer.
    offload_optimizer: bool = False
    # The share offloaded (megatron's OptimizerConfig.optimizer_offload_fraction): the first parameters up to
    # this share of the elements step on the host, the rest on the GPU. The planner picks it when unset.
    offload_fraction: float = 1.0


@dataclass
class RoleOptimizer:
    """A role's megatron optimizer and the scheduler that sets its per-group lr and weight decay."""

    optimizer: MegatronOptimizer
    scheduler: OptimizerParamScheduler
    ddp_chunks: Sequence[DistributedDataParallel] = ()
    # Steps taken while held (a supervised warm-up at its own lr) leave the schedule where it is.
    schedule_held: bool = False

    def zero_grad(self) -> None:
        """Zero the grads and the DDP grad buffers before a new accumulation.

        megatron's optimizer.zero_grad() leaves DDP's contiguous grad buffers (every param's `main_grad`)
        alone, as megatron's own training loop zeroes them separately; without this, gradients would sum
        over steps.
        """
        for chunk in self.ddp_chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def step(self) -> dict[str, float]:
        """Clip, update, advance the schedule; returns {"grad_norm" (pre-clip), "lr", "update_successful"}."""
        update_successful, grad_norm, _ = self.optimizer.step()
        if not self.schedule_held:
            self.scheduler.step(1)
        return {
            "grad_norm": float(grad_norm) if grad_norm is not None else float("nan"),
            "lr": self.optimizer.param_groups[0]["lr"],
            "update_successful": float(bool(update_successful)),
        }


def wrap_for_training(
    model_chunks: Sequence[torch.nn.Module],
    pg_collection: ProcessGroupCollection,
    *,
    use_distributed_optimizer: bool = True,
    overlap_grad_reduce: bool = False,
    bucket_size: int | None = None,
) -> list[DistributedDataParallel]:
    """Wrap each chunk in megatron-core DDP over the role's groups and hook grad sync into the schedules.

    bf16/fp16 models (config.bf16/fp16) are cast to that dtype first; the optimizer keeps fp32 main params.
    fp32 gradient reduction (`grad_reduce_in_fp32=True`); DDP averages over the dp group. Sets the model
    config's `finalize_model_grads_func` (DP reduction, tied-embedding all-reduce over `embd`) and
    `no_sync_func` (no reduction until the last micro-batch).
    """
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=overlap_grad_reduce,
        use_distributed_optimizer=use_distributed_optimizer,
        bucket_size=bucket_size,
    )
    config = get_model_config(model_chunks[0])
    if config.bf16 or config.fp16:
        # megatron's training loop wraps bf16/fp16 models in Float16Module, whose main effect is casting every
        # parameter (torch norms are built in fp32 even with params_dtype=bf16). Cast in place instead of
        # wrapping, so `ddp.module` stays the GPTModel.
        for chunk in model_chunks:
            chunk.to(dtype=torch.bfloat16 if config.bf16 else torch.float16)
    wrapped = [
        DistributedDataParallel(
            config, ddp_config, chunk, disable_bucketing=index > 0, pg_collection=pg_collection
        )
        for index, chunk in enumerate(model_chunks)
    ]
    config.finalize_model_grads_func = finalize_model_grads
    no_sync = [chunk.no_sync for chunk in wrapped]
    config.no_sync_func = no_sync[0] if len(no_sync) == 1 else no_sync
    return wrapped


def build_optimizer(
    ddp_chunks: Sequence[DistributedDataParallel],
    pg_collection: ProcessGroupCollection,
    settings: OptimizerSettings,
    precision: TrainingPrecision | None = None,
) -> RoleOptimizer:
    """megatron-core Adam over the DDP-wrapped chunks, clipping at `settings.grad_clip` (0 disables).

    Weight decay skips biases and 1-D parameters, as in megatron's own training loop.

    `settings.use_distributed_optimizer` must match the flag given to `wrap_for_training`.
    """
    precision = precision or TrainingPrecision.default()
    for chunk in ddp_chunks:
        if chunk.ddp_config.use_distributed_optimizer != settings.use_distributed_optimizer:
            raise ValueError(
                "use_distributed_optimizer: the optimizer and wrap_for_training disagree; pass the same value"
            )
    if settings.offload_optimizer and not (settings.use_distributed_optimizer and precision.bf16):
        # fp32 params: megatron 0.19's distributed optimizer hands HybridDeviceOptimizer non-leaf shard views.
        raise ValueError(
            "offload_optimizer: megatron's CPU offload needs use_distributed_optimizer=True and bf16 params "
            "(model.dtype=bf16)"
        )
    offload = {}
    if settings.offload_optimizer:
        # `offload_fraction` of it on the host, with the precision-aware optimizer that megatron's own
        # arguments require for CPU offload (megatron/training/arguments.py: the hybrid device optimizer reuses
        # its code path); the fp32 main params then live only in HybridDeviceOptimizer's copies (host copies
        # for the offloaded share, GPU ones for the rest).
        if not 0.0 < settings.offload_fraction <= 1.0:
            raise ValueError(f"offload_fraction: {settings.offload_fraction} is not in (0, 1]")
        offload = dict(optimizer_cpu_offload=True, optimizer_offload_fraction=settings.offload_fraction,
                       use_precision_aware_optimizer=True)
    config = OptimizerConfig(
        optimizer="adam",
        lr=settings.lr,
        # every param group carries its own min_lr (None unless set here), which the scheduler reads before
        # its own: left unset, any decaying style fails on its first step past the warm-up
        min_lr=settings.min_lr,
        weight_decay=settings.weight_decay,
        adam_beta1=settings.adam_beta1,
        adam_beta2=settings.adam_beta2,
        adam_eps=settings.adam_eps,
        clip_grad=settings.grad_clip,
        bf16=precision.bf16,
        params_dtype=precision.params_dtype,
        use_distributed_optimizer=settings.use_distributed_optimizer,
        **offload,
    )
    # Megatron's usual parameter groups: no weight decay on biases and 1-D parameters (norms). The groups
    # carry a wd_mult that only the scheduler applies: without the scheduler everything would be decayed.
    optimizer = get_megatron_optimizer(
        config,
        list(ddp_chunks),
        config_overrides=get_standard_config_overrides(config),
        use_gloo_process_groups=False,
        pg_collection=pg_collection,
    )
    if not settings.offload_optimizer:  # HybridDeviceOptimizer builds its own (fused) Adams
        fuse_torch_adam(optimizer)
    install_sync_free_grad_norm()
    scheduler = OptimizerParamScheduler(
        optimizer,
        init_lr=0.0 if settings.lr_warmup_steps else settings.lr,
        max_lr=settings.lr,
        min_lr=settings.min_lr,
        lr_warmup_steps=settings.lr_warmup_steps,
        lr_decay_steps=max(settings.lr_decay_steps, settings.lr_warmup_steps + 1),
        lr_decay_style=settings.lr_decay_style,
        start_wd=settings.weight_decay,
        end_wd=settings.weight_decay,
        wd_incr_steps=1,
        wd_incr_style="constant",
        # A resume keeps the checkpoint's step count and takes every other value from the config: learning
        # rates, warm-up and decay may change on resume (megatron's default kept the checkpoint's silently).
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,
    )
    return RoleOptimizer(optimizer, scheduler, tuple(ddp_chunks))


# World-wide `all_gather_object` calls one `get_megatron_optimizer` makes (megatron-core 0.19,
# megatron/core/optimizer/__init__.py): `_get_param_groups` aligns param-group keys across the whole world once
# for the dense parameters of our single model chunk and once for the expert-parallel ones (none here, but
# the gather still runs). tests/megatron_adapters/test_optimizer.py counts them.
OPTIMIZER_BUILD_GATHERS = 2


def join_optimizer_build_elsewhere() -> None:
    """What a rank outside a trained role calls while that role's ranks run `build_optimizer`.

    megatron-core aligns param groups across the *whole world*, so every rank must join each of those
    gathers (`OPTIMIZER_BUILD_GATHERS` per optimizer built anywhere), contributing no groups. One join too
    few pairs calls of different builds and, once the counts differ between ranks, hangs.
    """
    for _ in range(OPTIMIZER_BUILD_GATHERS):
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, [])
