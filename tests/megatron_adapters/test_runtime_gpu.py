"""GPU path of the runtime (one GPU, nccl): bf16 training step through DDP + distributed optimizer.

Checks that the CPU backend stays off, that logprobs of bf16 vocab-parallel logits equal an fp32 reference,
and that one bf16 step (fp32 main params, megatron's Float16 path) moves the weights with a finite norm.
"""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters import tiny_gpt

pytestmark = pytest.mark.gpu


def _bf16_step() -> dict:
    from megatron_adapters.cpu_backend import enable_cpu_backend
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.optimizer import (
        OptimizerSettings,
        TrainingPrecision,
        build_optimizer,
        wrap_for_training,
    )
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pgs = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(0, pgs)
    precision = TrainingPrecision.default()
    model = tiny_gpt.tiny_gpt(
        pgs,
        use_cpu_initialization=False,
        params_dtype=precision.params_dtype,
        bf16=precision.bf16,
        pipeline_dtype=precision.params_dtype,
    )
    model.cuda()  # torch norms are built on the CPU; megatron's get_model() moves the model before DDP
    before = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    chunks = wrap_for_training([model], pgs)
    optimizer = build_optimizer(chunks, pgs, OptimizerSettings(lr=1e-3), precision)
    batches = [{k: v.cuda() for k, v in b.items()} for b in tiny_gpt.micro_batches(2)]
    checks = []

    def loss_fn(logits, batch):
        targets = batch["input_ids"][:, 1:]
        logprobs = token_logprobs(logits[:, :-1], targets, pgs.tp)
        reference = (
            torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        )
        checks.append((logprobs.detach() - reference.detach()).abs().max().item())
        loss = -logprobs.mean()
        return loss, {"loss": loss}

    optimizer.zero_grad()
    metrics = run_forward_backward(chunks, pgs, batches, loss_fn)
    stats = optimizer.step()
    moved = max((p.detach().float() - before[n]).abs().max().item() for n, p in model.named_parameters())
    return {
        "cpu_backend": enable_cpu_backend(),
        "dtype": str(next(model.parameters()).dtype),
        "device": next(model.parameters()).device.type,
        "logprob_err": max(checks),
        "losses": [m["loss"].item() for m in metrics],
        "stats": stats,
        "moved": moved,
    }


def test_bf16_step_on_gpu():
    (result,) = run_distributed(_bf16_step, world_size=1, device="cuda")
    assert result["cpu_backend"] is False
    assert (result["dtype"], result["device"]) == ("torch.bfloat16", "cuda")
    assert result["logprob_err"] <= 1e-4
    assert all(0 < loss < 10 for loss in result["losses"])
    assert 0 < result["stats"]["grad_norm"] < float("inf") and result["stats"]["update_successful"] == 1.0
    assert result["moved"] > 1e-4
