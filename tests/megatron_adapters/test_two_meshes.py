"""Actor (TP2 x PP1) and critic (TP1 x PP2) on the same 2 ranks, in one process: both train and infer.

Each model's losses and forward-only outputs are checked against an unsharded copy of its weights.
"""

import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters import tiny_gpt


def _mean_logit_loss(output, batch):
    # Stands in for a value loss: any scalar of the last stage's output exercises the pipeline backward.
    loss = output.float().pow(2).mean()
    return loss, {"loss": loss}


def _positions(ids):
    return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)


def _reference_outputs(model, batches):
    with torch.no_grad():
        return [
            model(b["input_ids"], _positions(b["input_ids"]), None)
            for b in batches
        ]


def _two_roles() -> dict:
    import torch.distributed as dist

    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.logprobs import token_logprobs
    from megatron_adapters.optimizer import (
        OptimizerSettings,
        TrainingPrecision,
        build_optimizer,
        wrap_for_training,
    )
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    rank = dist.get_rank()
    single = [build_role_groups([r], tp=1, pp=1, dp=1) for r in range(2)][rank]
    actor_pgs = build_role_groups([0, 1], tp=2, pp=1, dp=1)
    critic_pgs = build_role_groups([0, 1], tp=1, pp=2, dp=1)
    batches = tiny_gpt.micro_batches(2)  # on compute_device(), like tiny_gpt's models

    def reference(seed):
        seed_role_rng(seed, single)
        model = tiny_gpt.tiny_gpt(single)
        return {n: p.detach().clone() for n, p in model.named_parameters()}, _reference_outputs(
            model, batches
        )

    actor_state, actor_ref = reference(1)
    critic_state, critic_ref = reference(2)

    def build(pgs, state):
        model = tiny_gpt.tiny_gpt(pgs)
        tiny_gpt.copy_into_shards(model, state, pgs)
        chunks = wrap_for_training([model], pgs)
        optimizer = build_optimizer(
            chunks, pgs, OptimizerSettings(lr=1e-3), TrainingPrecision.from_name("fp32")
        )
        return model, chunks, optimizer

    actor, actor_chunks, actor_opt = build(actor_pgs, actor_state)
    critic, critic_chunks, critic_opt = build(critic_pgs, critic_state)

    def actor_loss(logits, batch):
        logprobs = token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:], actor_pgs.tp)
        return -logprobs.mean(), {"logprobs": logprobs}

    out = {}
    # Inference first (ref/critic style), then one training step of each, interleaved on the same ranks.
    out["actor_logprobs"] = [
        m["logprobs"]
        for m in run_forward_backward(actor_chunks, actor_pgs, batches, actor_loss, forward_only=True)
    ]
    out["critic_outputs"] = [
        m["out"]
        for m in run_forward_backward(
            critic_chunks, critic_pgs, batches, lambda o, b: (o.sum() * 0, {"out": o}), forward_only=True
        )
    ]
    for name, chunks, opt, pgs, loss_fn in (
        ("actor", actor_chunks, actor_opt, actor_pgs, actor_loss),
        ("critic", critic_chunks, critic_opt, critic_pgs, _mean_logit_loss),
    ):
        opt.zero_grad()
        metrics = run_forward_backward(chunks, pgs, batches, loss_fn)
        stats = opt.step()
        out[f"{name}_metrics"] = len(metrics)
        out[f"{name}_grad_norm"] = stats["grad_norm"]
    for name, model, state, pgs in (
        ("actor", actor, actor_state, actor_pgs),
        ("critic", critic, critic_state, critic_pgs),
    ):
        view = tiny_gpt.sharded_view(model, state, pgs)
        out[f"{name}_moved"] = max((local - start).abs().max().item() for _, local, start in view)
    out["actor_ref_logprobs"] = [
        torch.log_softmax(r[:, :-1], -1).gather(-1, b["input_ids"][:, 1:].unsqueeze(-1)).squeeze(-1)
        for r, b in zip(actor_ref, batches, strict=True)
    ]
    out["critic_ref"] = critic_ref
    return out


def test_actor_and_critic_with_different_meshes_share_ranks():
    for result in run_distributed(_two_roles, world_size=2):
        for got, expected in zip(result["actor_logprobs"], result["actor_ref_logprobs"], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # the critic's outputs come from its last stage and were broadcast to both PP ranks
        for got, expected in zip(result["critic_outputs"], result["critic_ref"], strict=True):
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert result["actor_metrics"] == result["critic_metrics"] == 2
        assert result["actor_grad_norm"] > 0 and result["critic_grad_norm"] > 0
        assert result["actor_moved"] > 1e-4 and result["critic_moved"] > 1e-4
