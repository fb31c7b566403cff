"""A LoRA model under megatron DDP + the distributed optimizer: only adapters get grad buffers, optimizer
state and updates; the base weights are bitwise unchanged by a step (TP2, PP2 and DP2 roles on 2 gloo ranks).
Qwen2 adds tied embeddings (at PP2 megatron all-reduces the embedding's grad over `embd`: frozen, it has none)
and a qkv bias (frozen with its linear)."""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch

ROLES = {"tp2": (2, 1, 1), "pp2": (1, 2, 1), "dp2": (1, 1, 2)}
MICRO_BATCHES = 2


def _lm_loss(logits, batch, tp_group):
    from megatron_adapters.logprobs import token_logprobs

    loss = -token_logprobs(logits[:, :-1], batch["input_ids"][:, 1:], tp_group).mean()
    return loss, {"loss": loss}


def _train_rank(path, batches):
    import torch.distributed as dist

    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.lora import LoraSettings, is_adapter_param
    from megatron_adapters.model import build_gpt
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    world = dist.get_world_size()
    out = {}
    for name, (tp, pp, dp) in ROLES.items():
        pg = build_role_groups(list(range(world)), tp=tp, pp=pp, dp=dp)
        seed_role_rng(3, pg)
        model = build_gpt(path, pg, spec="sdpa", lora=LoraSettings(rank=4, alpha=8.0))
        adapters = {id(p) for p in model.parameters() if is_adapter_param(p)}
        adapter_numel = sum(p.numel() for p in model.parameters() if is_adapter_param(p))
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        chunks = wrap_for_training([model], pg)
        optimizer = build_optimizer(chunks, pg, OptimizerSettings(lr=1e-2), TrainingPrecision.from_name("fp32"))
        buffer_params = [p for chunk in chunks for buf in chunk.buffers for p in buf.params]
        # the distributed optimizer's model-side groups, and the numel its Adam holds state for (over DP)
        inner = getattr(optimizer.optimizer, "chained_optimizers", [optimizer.optimizer])
        model_groups = [p for opt in inner for g in opt.model_fp32_groups + opt.model_float16_groups for p in g]
        state_numel = torch.tensor(float(sum(p.numel() for opt in inner for g in opt.optimizer.param_groups
                                             for p in g["params"])))
        dist.all_reduce(state_numel, group=pg.dp)
        optimizer.zero_grad()
        per_replica = MICRO_BATCHES // dp
        mine = batches[pg.dp.rank() * per_replica:(pg.dp.rank() + 1) * per_replica]
        run_forward_backward(chunks, pg, mine, lambda o, b, g=pg.tp: _lm_loss(o, b, g))
        stats = optimizer.step()
        changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
        out[name] = dict(
            buffers_only_adapters=all(id(p) in adapters for p in buffer_params),
            buffer_numel=sum(p.numel() for p in buffer_params),
            groups_only_adapters=all(id(p) in adapters for p in model_groups),
            state_numel=int(state_numel.item()), adapter_numel=adapter_numel,
            changed=changed, adapter_names={n for n, p in model.named_parameters() if is_adapter_param(p)},
            grad_norm=stats["grad_norm"], update_successful=stats["update_successful"],
        )
    return out


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_only_adapters_train(tmp_path, kind):
    model = save_tiny_model(kind, tmp_path, seed=2)
    ids = token_batch(model.config.vocab_size, batch=MICRO_BATCHES, seq=8, seed=4)
    batches = [{"input_ids": ids[i:i + 1]} for i in range(MICRO_BATCHES)]
    for rank_result in run_distributed(_train_rank, world_size=2, args=(str(tmp_path), batches)):
        for name, r in rank_result.items():
            assert r["adapter_numel"] > 0, name
            assert r["buffers_only_adapters"] and r["buffer_numel"] == r["adapter_numel"], name
            assert r["groups_only_adapters"] and r["state_numel"] == r["adapter_numel"], name
            assert r["update_successful"] == 1.0 and r["grad_norm"] > 0, name
            # B starts at zero, so the first step moves B (A's gradient is B^T ... = 0); nothing else moves
            assert r["changed"] and r["changed"] <= r["adapter_names"], (name, r["changed"] - r["adapter_names"])
            assert any(".lora_b." in n for n in r["changed"]), name
        # A is drawn whole and sliced, so TP2 starts from TP1's adapters and sees the same gradient; the norm
        # counts TP-replicated adapter weights (column A, row B) once
        tp2, tp1 = rank_result["tp2"]["grad_norm"], rank_result["dp2"]["grad_norm"]
        assert abs(tp2 - tp1) <= 1e-5 * tp1, (tp2, tp1)


def _grad_norm_rank(path, batches, recompute):
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.lora import LoraSettings
    from megatron_adapters.model import build_gpt
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pg = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(3, pg)
    overrides = {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    model = build_gpt(path, pg, spec="sdpa", lora=LoraSettings(rank=4, alpha=8.0), **(overrides if recompute else {}))
    chunks = wrap_for_training([model], pg)
    optimizer = build_optimizer(chunks, pg, OptimizerSettings(lr=1e-2), TrainingPrecision.from_name("fp32"))
    optimizer.zero_grad()
    run_forward_backward(chunks, pg, batches, lambda o, b, g=pg.tp: _lm_loss(o, b, g))
    return optimizer.step()["grad_norm"]


def test_adapters_get_the_same_gradient_under_full_recompute(tmp_path):
    # Before: megatron's reentrant recompute passed no gradient back through the frozen embedding's output, so
    # roles.actor.activation_recompute=full with LoRA trained nothing (grad norm 0, no error).
    model = save_tiny_model("llama", tmp_path, seed=2)
    ids = token_batch(model.config.vocab_size, batch=MICRO_BATCHES, seq=8, seed=4)
    batches = [{"input_ids": ids[i:i + 1]} for i in range(MICRO_BATCHES)]
    plain, = run_distributed(_grad_norm_rank, world_size=1, args=(str(tmp_path), batches, False))
    recomputed, = run_distributed(_grad_norm_rank, world_size=1, args=(str(tmp_path), batches, True))
    assert plain > 0 and abs(recomputed - plain) <= 1e-5 * plain, (recomputed, plain)


def _forward_twice_rank(path, batches):
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.lora import LoraSettings, adapter_modules
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng

    pg = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(3, pg)
    model = build_gpt(path, pg, spec="sdpa", lora=LoraSettings(rank=4, alpha=8.0, dropout=0.5))
    with torch.no_grad():  # B non-zero, so the adapters' (dropped-out) input shows in the output
        for _, module in adapter_modules(model):
            for b in module.lora_b:
                b.normal_(std=0.5)
    model.train()

    def keep(output, mb):
        return output.new_zeros(()), {"out": output.detach().clone()}

    runs = [run_forward_backward([model], pg, batches, keep, forward_only=True) for _ in range(2)]
    same = all(torch.equal(a["out"], b["out"]) for a, b in zip(*runs, strict=True))
    return same, all(m.training for m in model.modules())


def test_forward_only_passes_run_without_dropout_and_leave_the_mode_as_it_was(tmp_path):
    # Before: a trained role's forward-only passes (old log-probs, reference) ran in training mode, so LoRA dropout
    # changed the actor's log-probs of the rollout's tokens and tiny_cpu's parity gate failed (0.156 > 1e-4).
    model = save_tiny_model("llama", tmp_path, seed=2)
    ids = token_batch(model.config.vocab_size, batch=MICRO_BATCHES, seq=8, seed=4)
    batches = [{"input_ids": ids[i:i + 1]} for i in range(MICRO_BATCHES)]
    (same, still_training), = run_distributed(_forward_twice_rank, world_size=1, args=(str(tmp_path), batches))
    assert same and still_training
