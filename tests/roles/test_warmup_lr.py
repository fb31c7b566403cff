"""The supervised warm-up trains at its own constant lr and leaves the RL run's schedule where it was."""

from types import SimpleNamespace

import pytest
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

from hybridflow.roles.model_role import ModelRole
from megatron_adapters.optimizer import RoleOptimizer


class _Steps:
    """A megatron optimizer's surface as RoleOptimizer.step uses it; records the lr of each step."""

    def __init__(self) -> None:
        self.param_groups = [{"lr": 0.0, "weight_decay": 0.0}, {"lr": 0.0, "weight_decay": 0.0, "wd_mult": 0.0}]
        self.lrs: list[float] = []

    def step(self):
        self.lrs.append(self.param_groups[0]["lr"])
        return True, 1.0, None


def test_warmup_steps_run_at_sft_lr_and_do_not_use_up_the_decay():
    """Before: each warm-up step advanced the scheduler, so 8 warm-up steps of a linear decay over the RL run's 4
    optimizer steps left RL at lr 0 (and the warm-up's lr decayed with it)."""
    inner = _Steps()
    scheduler = OptimizerParamScheduler(inner, init_lr=1e-3, max_lr=1e-3, min_lr=0.0, lr_warmup_steps=0,
                                        lr_decay_steps=4, lr_decay_style="linear", start_wd=0.0, end_wd=0.0,
                                        wd_incr_steps=1, wd_incr_style="constant")
    role = SimpleNamespace(optimizer=RoleOptimizer(inner, scheduler))
    with ModelRole.learning_rate(role, 5e-4):
        for _ in range(8):
            role.optimizer.step()
    for _ in range(4):
        role.optimizer.step()
    assert inner.lrs[:8] == [5e-4] * 8
    assert inner.lrs[8:] == pytest.approx([1e-3, 7.5e-4, 5e-4, 2.5e-4])  # 1e-3 * (1 - k / 4), k = 0..3
