"""`trainer.lr_warmup_steps / lr_decay_style / lr_decay_steps / min_lr` reach megatron's lr scheduler.

The config goes through the trainer's `optimizer_settings` into `build_optimizer` on a tiny one-rank model;
the scheduler's lr after k steps is compared with the schedule written out by hand (linear warm-up from 0,
then linear or cosine from lr down to min_lr). Bad schedules are refused when the config loads.
"""

import math

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from tests.distributed_harness import run_distributed

STEPS = 14


def _scheduled_lrs(overrides: list[str], role: str) -> list[float]:
    from hybridflow.trainer.build import optimizer_settings
    from megatron_adapters.optimizer import TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng
    from tests.megatron_adapters import tiny_gpt

    cfg = load_experiment("tiny_cpu", overrides)
    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(5, pgs)
    chunks = wrap_for_training([tiny_gpt.tiny_gpt(pgs)], pgs)
    role_optimizer = build_optimizer(chunks, pgs, optimizer_settings(cfg, role, 0.0),
                                     TrainingPrecision.from_name("fp32"))
    lrs = [role_optimizer.optimizer.param_groups[0]["lr"]]
    for _ in range(STEPS):
        role_optimizer.scheduler.step(1)
        lrs.append(role_optimizer.optimizer.param_groups[0]["lr"])
    return lrs


def _by_hand(k: int, lr: float, warmup: int, decay: int, min_lr: float, style: str) -> float:
    if k <= warmup and warmup:
        return lr * k / warmup
    if style == "constant":
        return lr
    ratio = min((k - warmup) / (decay - warmup), 1.0)
    coeff = 1.0 - ratio if style == "linear" else 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (lr - min_lr)


@pytest.mark.parametrize(("style", "role", "lr"), [("cosine", "actor", 5e-4), ("linear", "critic", 1e-3)])
def test_scheduler_follows_the_configured_warmup_and_decay(style, role, lr):
    overrides = ["trainer.lr_warmup_steps=3", f"trainer.lr_decay_style={style}", "trainer.lr_decay_steps=10",
                 "trainer.min_lr=1e-5"]
    got = run_distributed(_scheduled_lrs, world_size=1, args=(overrides, role))[0]
    want = [_by_hand(k, lr, 3, 10, 1e-5, style) for k in range(STEPS + 1)]
    assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
    assert got[0] == 0.0 and got[3] == pytest.approx(lr) and got[-1] == pytest.approx(1e-5)


def test_default_schedule_is_a_constant_lr():
    got = run_distributed(_scheduled_lrs, world_size=1, args=([], "actor"))[0]
    assert got == pytest.approx([5e-4] * (STEPS + 1))


def test_decay_defaults_to_the_runs_optimizer_steps():
    from hybridflow.config.experiment import lr_decay_steps

    cfg = load_experiment("tiny_cpu", ["trainer.lr_decay_style=linear"])
    # 60 RL steps x 1 PPO epoch x (32 prompts x 1 sample / mini-batches of 16)
    assert lr_decay_steps(cfg) == 60 * 1 * 2


@pytest.mark.parametrize(("overrides", "message"), [
    (["trainer.lr_decay_style=cosine", "trainer.min_lr=1e-3"], "^trainer.min_lr: 0.001 exceeds trainer.lr=0.0005"),
    # the constant default too: megatron's scheduler asserts min_lr <= lr before any step (a bare AssertionError)
    (["trainer.min_lr=1e-3"], "^trainer.min_lr: 0.001 exceeds trainer.lr=0.0005; .*constant schedule never uses it"),
    (["trainer.lr_decay_style=linear", "trainer.lr_warmup_steps=5", "trainer.lr_decay_steps=5"],
     "^trainer.lr_decay_steps: 5 does not exceed trainer.lr_warmup_steps=5"),
    (["trainer.lr_decay_style=step"], "^trainer.lr_decay_style: "),
])
def test_bad_schedules_are_refused_at_load_time(overrides, message):
    with pytest.raises(UserError, match=message):
        load_experiment("tiny_cpu", overrides)
