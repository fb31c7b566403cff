"""The forward/backward wrapper under PP2: activation recompute, forward-only mode, metric broadcast."""

import pytest
import torch

from megatron_adapters.forward_backward import run_forward_backward
from tests.distributed_harness import run_distributed
from tests.megatron_adapters import tiny_gpt


def _loss(output, batch):
    loss = output.float().logsumexp(-1).mean()
    return loss, {"loss": loss}


def _pipeline_checks() -> dict:
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pgs = build_role_groups([0, 1], tp=1, pp=2, dp=1)
    seed_role_rng(3, pgs)
    plain = tiny_gpt.tiny_gpt(pgs)
    state = {n: p.detach().clone() for n, p in plain.named_parameters()}
    recomputed = tiny_gpt.tiny_gpt(
        pgs, recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1
    )
    recomputed.load_state_dict(plain.state_dict())
    batches = tiny_gpt.micro_batches(3)

    losses = {}
    grads = {}
    for name, model in (("plain", plain), ("recomputed", recomputed)):
        metrics = run_forward_backward([model], pgs, batches, _loss)
        losses[name] = [m["loss"].item() for m in metrics]
        grads[name] = {n: p.grad.clone() for n, p in model.named_parameters()}
    plain.zero_grad()
    inference = run_forward_backward([plain], pgs, batches, _loss, forward_only=True)
    local_only = run_forward_backward(
        [plain], pgs, batches, _loss, forward_only=True, broadcast_metrics=False
    )
    return {
        "stage": pgs.pp.rank(),
        "losses": losses,
        "grad_diff": max(
            (grads["plain"][n] - grads["recomputed"][n]).abs().max().item() for n in grads["plain"]
        ),
        "grad_max": max(g.abs().max().item() for g in grads["plain"].values()),
        "inference": [m["loss"].item() for m in inference],
        "local_only": len(local_only),
        "no_grads_after_inference": all(p.grad is None for p in plain.parameters()),
        "unchanged": all(torch.equal(p, state[n]) for n, p in plain.named_parameters()),
    }


def test_pipeline_forward_backward():
    first, last = run_distributed(_pipeline_checks, world_size=2)
    assert first["losses"] == last["losses"]  # broadcast from the last stage
    assert first["losses"]["plain"] == pytest.approx(first["losses"]["recomputed"], rel=1e-6)
    for stage in (first, last):
        assert stage["grad_max"] > 0
        assert stage["grad_diff"] <= 1e-6 * max(1.0, stage["grad_max"])  # recompute gives the same grads
        assert stage["inference"] == pytest.approx(first["losses"]["plain"], rel=1e-6)
        assert stage["no_grads_after_inference"] and stage["unchanged"]
    assert (first["local_only"], last["local_only"]) == (0, 3)


def test_empty_micro_batches_are_rejected():
    with pytest.raises(ValueError, match="^micro_batches:"):
        run_forward_backward([torch.nn.Linear(1, 1)], None, [], _loss)
