"""fp32 main params of a bf16 role come from the checkpoint's values (megatron_adapters.main_params), so an
lr-sized Adam step reaches the bf16 weights in proportion to its size from the first step (issue #43).

megatron upcasts its bf16 model params to make the masters: on the bf16 grid, a 2e-6 step rounds away for every
weight with |w| > 0.001 (half a bf16 ulp is 3.8e-6 there). Reference: the same model's fp32 values, and the
expected change of a bf16 weight under round-to-nearest of a master drawn inside its rounding interval, which
equals the master's change.
"""

import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters import tiny_gpt

LR = 2e-6


def _one_step(seed_masters: bool) -> dict:
    import torch.distributed as dist

    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.main_params import seed_main_params
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pgs = build_role_groups(list(range(dist.get_world_size())), tp=1, pp=1, dp=dist.get_world_size())
    seed_role_rng(3, pgs)
    model = tiny_gpt.tiny_gpt(pgs, bf16=True)  # fp32 params at build: the "checkpoint" values, off the bf16 grid
    checkpoint = {n: p.detach().clone() for n, p in model.named_parameters()}
    chunks = wrap_for_training([model], pgs)  # casts the params to bf16
    opt = build_optimizer(chunks, pgs, OptimizerSettings(lr=LR, grad_clip=0.0), TrainingPrecision.from_name("bf16"))
    seeded = seed_main_params(opt.optimizer, model, checkpoint.items()) if seed_masters else 0
    masters = {n: m for n, (m, span) in _mains(opt.optimizer, model).items()}
    exact = all(torch.equal(m, checkpoint[n].reshape(-1)[span] if span else checkpoint[n])
                for n, (m, span) in _mains(opt.optimizer, model).items())
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    master_before = {n: m.detach().clone() for n, m in masters.items()}
    opt.zero_grad()
    loss = lambda out, b: (out.float().logsumexp(-1).mean(), {})  # noqa: E731
    run_forward_backward(chunks, pgs, tiny_gpt.micro_batches(2), loss)
    opt.step()
    moved = reached = 0.0
    for n, (m, span) in _mains(opt.optimizer, model).items():
        if checkpoint[n].dim() < 2:
            continue
        big = (checkpoint[n].abs() > 0.01).reshape(-1)[span] if span else checkpoint[n].abs() > 0.01
        step_sign = torch.sign(m - master_before[n])[big]
        bf16_change = (dict(model.named_parameters())[n].detach().float() - before[n])
        bf16_change = bf16_change.reshape(-1)[span] if span else bf16_change
        reached += float((bf16_change[big] * step_sign).sum())
        moved += float((m - master_before[n])[big].abs().sum())
    return {"seeded": seeded, "exact": exact, "reached": reached, "moved": moved}


def _mains(optimizer, model):
    from megatron_adapters.main_params import _main_params

    by_id = _main_params(optimizer)
    return {n: by_id[id(p)] for n, p in model.named_parameters() if id(p) in by_id}


def test_masters_hold_the_checkpoint_values_and_a_small_step_reaches_the_bf16_weights():
    seeded = run_distributed(_one_step, world_size=2, args=(True,))
    old = run_distributed(_one_step, world_size=2, args=(False,))
    for new, before in zip(seeded, old, strict=True):
        assert new["seeded"] > 0 and new["exact"] and not before["exact"]
        assert new["moved"] > 0
        # seeded: the bf16 weights move by what the masters moved, in expectation (rounding noise ~ 10 %)
        assert 0.5 < new["reached"] / new["moved"] < 1.5, new
        # upcast masters: not one weight above 0.01 moves (the step is under half an ulp)
        assert before["reached"] == 0.0, before
