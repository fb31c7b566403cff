"""Seed a bf16 role's fp32 main params from the checkpoint's own values, not from the bf16 copy of them.

megatron-core's mixed-precision optimizers make their fp32 main params by upcasting the bf16 model params, so a
run that starts from an fp32 (or fp16) checkpoint begins with every master weight on the bf16 grid. Adam's
steps at RL learning rates (~1e-6 per element) are far below half a bf16 ulp of a typical weight (6e-5 at
|w| = 0.03), so the bf16 copy the forward pass uses does not move until a master weight has drifted half an
ulp: for SmolLM2-135M at lr 3e-6 the policy stayed nearly still for ~20 RL steps where TRL's (fp32 weights under
bf16 autocast, off the grid) moved at once (issue #43). Masters seeded from the checkpoint sit where the
checkpoint put them, inside their bf16 rounding interval, so lr-sized updates reach the bf16 copy in proportion
to their size from the first step, as they do under autocast. megatron offers the same through
`reload_model_params(state_dict)` for its distributed optimizer only, and wants the whole model's fp32 state at
once; this copies one tensor at a time and covers both of its optimizers.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from megatron.core.optimizer import ChainedOptimizer, MegatronOptimizer
from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer
from megatron.core.optimizer.optimizer import Float16OptimizerWithFloat16Params


def _main_params(optimizer: MegatronOptimizer) -> dict[int, tuple[torch.Tensor, slice | None]]:
    """id(bf16 model param) -> (its fp32 main tensor, the slice of the flattened param it holds; None: all)."""
    found: dict[int, tuple[torch.Tensor, slice | None]] = {}
    for opt in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        if opt.config.use_precision_aware_optimizer:
            continue  # the inner optimizer (CPU offload's HybridDeviceOptimizer) holds its own fp32 copies
        if isinstance(opt, DistributedOptimizer):
            for model_group, main_group in zip(opt.model_float16_groups, opt.shard_fp32_from_float16_groups,
                                               strict=True):
                for param, main in zip(model_group, main_group, strict=True):
                    span = opt._get_model_param_range_map(param)["param"]
                    found[id(param)] = (main, slice(span.start, span.end))
        elif isinstance(opt, Float16OptimizerWithFloat16Params):
            for model_group, main_group in zip(opt.float16_groups, opt.fp32_from_float16_groups, strict=True):
                for param, main in zip(model_group, main_group, strict=True):
                    found[id(param)] = (main, None)
    return found


def seed_main_params(optimizer: MegatronOptimizer | ChainedOptimizer, model: torch.nn.Module,
                     values: Iterable[tuple[str | None, torch.Tensor]]) -> int:
    """Copy each (parameter name of `model`, full-precision value) into the optimizer's fp32 main param.

    `values` as `megatron_adapters.hf_safetensors.hf_shards` yields them (None names are skipped). Returns how
    many parameters were seeded; params without an fp32 main copy (an fp32 model, megatron's CPU-offload
    optimizer, which keeps its own copies) are left alone. Call before the first step.
    """
    mains = _main_params(optimizer)
    params = dict(model.named_parameters())
    seeded = 0
    for name, value in values:
        if name is None or id(params[name]) not in mains:
            continue
        main, span = mains[id(params[name])]
        flat = value.to(device=main.device, dtype=torch.float32).reshape(-1)
        main.data.copy_(flat if span is None else flat[span])
        seeded += 1
    return seeded
