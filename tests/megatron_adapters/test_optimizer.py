"""One optimizer step with megatron DDP + distributed optimizer + grad clipping equals a single-process one.

Roles TP2 x PP2 (dp 1) and TP1 x PP2 x DP2 run on the same 4 ranks. The reference is an unsharded model of
the same weights stepped by torch.optim.AdamW with torch's clip_grad_norm_ (megatron's param groups:
no weight decay for biases and 1-D params). Tolerance: 1e-5 absolute on the updated weights, 0.1% of the
lr of 1e-2: Adam's first step is g / (|g| + eps), which amplifies float32 rounding (different summation order
across ranks) for elements whose gradient is near eps; typical differences are 1e-8.
"""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters import tiny_gpt

LR, WEIGHT_DECAY, GRAD_CLIP = 1e-2, 0.1, 0.05
ROLES = {"tp2_pp2": (2, 2, 1), "tp1_pp2_dp2": (1, 2, 2)}
MICRO_BATCHES = 4


def _lm_loss(logits, batch, tp_group):
    from megatron_adapters.logprobs import token_logprobs

    loss = -token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:], tp_group).mean()
    return loss, {"loss": loss}


def _reference_step(model, batches) -> tuple[dict, float, list[float]]:
    losses = []
    for batch in batches:
        ids = batch["input_ids"]
        logits = model(ids, torch.arange(ids.shape[1], device=ids.device).expand_as(ids), None)
        log_p = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        loss = -log_p.gather(-1, ids[:, 1:].unsqueeze(-1)).mean()
        (loss / len(batches)).backward()
        losses.append(loss.item())
    params = dict(model.named_parameters())
    grad_norm = torch.nn.utils.clip_grad_norm_(params.values(), GRAD_CLIP).item()
    decay = [p for n, p in params.items() if p.dim() > 1 and not n.endswith(".bias")]
    no_decay = [p for n, p in params.items() if not (p.dim() > 1 and not n.endswith(".bias"))]
    adam = torch.optim.AdamW(
        [{"params": decay, "weight_decay": WEIGHT_DECAY}, {"params": no_decay, "weight_decay": 0.0}], lr=LR
    )
    adam.step()
    return {n: p.detach().clone() for n, p in params.items()}, grad_norm, losses


def _step_all_roles() -> dict:
    import torch.distributed as dist

    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.optimizer import (
        OptimizerSettings,
        TrainingPrecision,
        build_optimizer,
        wrap_for_training,
    )
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    world, rank = dist.get_world_size(), dist.get_rank()
    single = [build_role_groups([r], tp=1, pp=1, dp=1) for r in range(world)][rank]
    roles = {
        name: build_role_groups(list(range(world)), tp=tp, pp=pp, dp=dp)
        for name, (tp, pp, dp) in ROLES.items()
    }
    seed_role_rng(5, single)
    reference = tiny_gpt.tiny_gpt(single)
    initial = {n: p.detach().clone() for n, p in reference.named_parameters()}
    batches = tiny_gpt.micro_batches(MICRO_BATCHES)
    updated, ref_norm, ref_losses = _reference_step(reference, batches) if rank == 0 else (None, None, None)
    # Through the CPU: a pickled CUDA tensor would unpickle on rank 0's GPU in every rank.
    holder = [({n: t.cpu() for n, t in updated.items()} if rank == 0 else None, ref_norm, ref_losses)]
    dist.broadcast_object_list(holder, src=0)
    updated, ref_norm, ref_losses = holder[0]
    device = next(reference.parameters()).device  # compute_device(): the CPU, or this rank's GPU
    updated = {n: t.to(device) for n, t in updated.items()}

    out = {}
    settings = OptimizerSettings(lr=LR, weight_decay=WEIGHT_DECAY, grad_clip=GRAD_CLIP)
    for name, pgs in roles.items():
        seed_role_rng(5, pgs)
        model = tiny_gpt.tiny_gpt(pgs)
        tiny_gpt.copy_into_shards(model, initial, pgs)
        chunks = wrap_for_training([model], pgs)
        optimizer = build_optimizer(chunks, pgs, settings, TrainingPrecision.from_name("fp32"))
        optimizer.zero_grad()
        per_replica = MICRO_BATCHES // pgs.dp.size()
        mine = batches[pgs.dp.rank() * per_replica : (pgs.dp.rank() + 1) * per_replica]
        metrics = run_forward_backward(chunks, pgs, mine, lambda out, b, g=pgs.tp: _lm_loss(out, b, g))
        stats = optimizer.step()
        diffs = {
            n: (local - expected).abs().max().item()
            for n, local, expected in tiny_gpt.sharded_view(model, updated, pgs)
        }
        view = tiny_gpt.sharded_view(model, initial, pgs)
        moved = max((local - start).abs().max().item() for _, local, start in view)
        out[name] = {
            "diffs": diffs,
            "grad_norm": stats["grad_norm"],
            "moved": moved,
            "losses": [m["loss"].item() for m in metrics],
            "dp_rank": pgs.dp.rank(),
        }
    return {"roles": out, "ref_norm": ref_norm, "ref_losses": ref_losses}


def test_distributed_optimizer_step_matches_single_process():
    results = run_distributed(_step_all_roles, world_size=4)
    for result in results:
        ref_losses = result["ref_losses"]
        assert result["ref_norm"] > GRAD_CLIP  # clipping is active in this step
        for name, role in result["roles"].items():
            assert max(role["diffs"].values()) <= 1e-5, (name, role["diffs"])
            assert role["moved"] > 1e-3, name  # the step really changed the weights
            assert abs(role["grad_norm"] - result["ref_norm"]) <= 1e-5 * result["ref_norm"], name
            per_replica = MICRO_BATCHES // ROLES[name][2]
            expected = ref_losses[role["dp_rank"] * per_replica : (role["dp_rank"] + 1) * per_replica]
            assert role["losses"] == pytest.approx(expected, rel=1e-5), name


def _count_world_gathers() -> tuple[int, int]:
    import torch.distributed as dist

    from megatron_adapters.optimizer import (
        OPTIMIZER_BUILD_GATHERS,
        OptimizerSettings,
        TrainingPrecision,
        build_optimizer,
        wrap_for_training,
    )
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(5, pgs)
    chunks = wrap_for_training([tiny_gpt.tiny_gpt(pgs)], pgs)
    calls = []
    original = dist.all_gather_object

    def counting(*args, **kwargs):
        if kwargs.get("group", args[2] if len(args) > 2 else None) is None:  # the default (world) group
            calls.append(1)
        return original(*args, **kwargs)

    dist.all_gather_object = counting
    try:
        build_optimizer(chunks, pgs, OptimizerSettings(lr=LR), TrainingPrecision.from_name("fp32"))
    finally:
        dist.all_gather_object = original
    return len(calls), OPTIMIZER_BUILD_GATHERS


def test_ranks_outside_a_role_join_as_many_world_gathers_as_its_optimizer_build_makes():
    # A rank outside a trained role joins OPTIMIZER_BUILD_GATHERS world-wide gathers per optimizer built
    # elsewhere (join_optimizer_build_elsewhere); one too few hung a placement with a rank in no trained role.
    made, joined = run_distributed(_count_world_gathers, world_size=1)[0]
    assert made == joined
