"""A role built with `roles.<role>.lora` (CPU, gloo, fp32, 2 ranks at TP2 and at TP1 x DP2): the HF checkpoint
loads into the base weights, only adapters get grads, DDP buffers and optimizer state, a train step moves the
adapters and leaves the base bitwise as loaded; the reference as the actor with adapters off
(`actor_base_role`) gives the log-probs of a model built without adapters from the same checkpoint."""

import pytest
import torch

from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch
from tests.roles.nll import nll_loss

ROWS, SEQ = 4, 10


def _lora_role(hf_dir: str, tp: int, ids: torch.Tensor) -> dict:
    from hybridflow.config.parallel import LoraConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import (
        OptimizerSettings,
        actor_base_role,
        build_model_role,
        lora_settings,
        per_token_logprobs,
    )
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.lora import is_adapter_param
    from megatron_adapters.process_groups import build_role_groups

    dp = 2 // tp
    groups = build_role_groups([0, 1], tp=tp, pp=1, dp=dp)
    mesh = RoleMesh("actor", (0, 1), ParallelDims(tp, 1, dp))
    lora = lora_settings(LoraConfig(rank=4, alpha=8.0))
    actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 2,
                             optimizer=OptimizerSettings(lr=1e-2), seed=1, lora=lora)
    # the independent reference: the same checkpoint, no adapters, forward only
    base = build_model_role("base", mesh, groups, hf_dir, "lm", torch.float32, 2, seed=1)
    model, plain = unwrap(actor.model), unwrap(base.model)
    base_params = {n: p for n, p in model.named_parameters() if not is_adapter_param(p)}
    adapters = {n for n, p in model.named_parameters() if is_adapter_param(p)}
    loaded = dict(plain.named_parameters())
    out = {"tp": tp, "adapters": adapters,
           "base_loaded": base_params.keys() == loaded.keys()
           and all(torch.equal(p, loaded[n]) for n, p in base_params.items()),
           "trainable": {n for n, p in model.named_parameters() if p.requires_grad},
           "ddp": {n for n, p in model.named_parameters() if id(p) in {id(q) for b in actor.model.buffers
                                                                       for q in b.params}}}
    inner = getattr(actor.optimizer.optimizer, "chained_optimizers", [actor.optimizer.optimizer])
    names = {id(p): n for n, p in model.named_parameters()}
    out["optimized"] = {names[id(p)] for opt in inner for g in opt.model_fp32_groups + opt.model_float16_groups
                        for p in g}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}

    tensors = {"input_ids": ids[actor.local_rows(ROWS)]}
    stats = actor.train(actor.micro_batches(tensors), nll_loss(actor))
    out["grad_norm"] = stats["grad_norm"]
    out["changed"] = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    out["adapter_grads"] = {n for n, p in model.named_parameters() if getattr(p, "main_grad", None) is not None}

    ref = actor_base_role(actor, "ref", 2)
    logprobs = per_token_logprobs
    with_adapters = actor.forward(tensors, logprobs(actor, 1.0))
    out["ref"] = ref.forward(tensors, logprobs(ref, 1.0))
    out["base"] = base.forward(tensors, logprobs(base, 1.0))
    out["actor_before"], out["actor_after"] = with_adapters, actor.forward(tensors, logprobs(actor, 1.0))
    return out


@pytest.mark.parametrize("tp", [2, 1], ids=["tp2", "tp1_dp2"])
def test_lora_role_trains_adapters_only(tmp_path, tp):
    hf = save_tiny_model("llama", tmp_path, seed=3)
    ids = token_batch(hf.config.vocab_size, batch=ROWS, seq=SEQ, seed=5)
    results = run_distributed(_lora_role, world_size=2, args=(str(tmp_path), tp, ids))
    # the distributed optimizer holds, over the DP replicas, every adapter and nothing else
    assert set().union(*(out["optimized"] for out in results)) == results[0]["adapters"]
    for out in results:
        adapters = out["adapters"]
        assert adapters and all(".lora_a" in n or ".lora_b." in n for n in adapters)
        assert out["base_loaded"], "the checkpoint did not load into the base weights"
        assert out["trainable"] == adapters and out["ddp"] == adapters and out["optimized"] <= adapters
        assert out["adapter_grads"] <= adapters and out["grad_norm"] > 0
        # B starts at zero, so the first step moves B only (A's gradient is scaled by B); the base never moves
        assert out["changed"] and out["changed"] <= adapters and all(".lora_b." in n for n in out["changed"])
        # the reference is the base model exactly (same kernels, adapters skipped), while the actor has moved
        torch.testing.assert_close(out["ref"], out["base"], rtol=0, atol=0)
        assert (out["actor_before"] - out["base"]).abs().max() > 1e-4
        # the reference's pass switched the adapters off only for itself
        assert torch.equal(out["actor_after"], out["actor_before"])


def _sync_rank(hf_dir: str, ids: torch.Tensor) -> dict:
    from hybridflow.config.parallel import LoraConfig
    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import OptimizerSettings, build_model_role, lora_settings
    from hybridflow.roles.rollout_role import RolloutRole
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.hf_safetensors import stage_entries
    from megatron_adapters.lora import adapter_modules
    from megatron_adapters.process_groups import build_role_groups

    groups = build_role_groups([0, 1], tp=2, pp=1, dp=1)
    mesh = RoleMesh("actor", (0, 1), ParallelDims(2, 1, 1))
    actor = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 2,
                             optimizer=OptimizerSettings(lr=1e-2), seed=1, lora=lora_settings(LoraConfig(rank=4)))
    actor.train(actor.micro_batches({"input_ids": ids}), nll_loss(actor))  # B moves off zero
    model = unwrap(actor.model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    params = dict(model.named_parameters())
    expected = {entry.mcore: params[name].detach().clone() for entry, name in stage_entries(model)}
    moved = 0.0
    for name, module in adapter_modules(model):  # independent of adapters_merged: W + (alpha / rank) B A
        key = next(entry.mcore for entry, n in stage_entries(model) if n == f"{name}.weight")
        expected[key] = expected[key] + module.delta_weight().detach()
        moved = max(moved, float(module.delta_weight().abs().max()))

    class Bridge:  # records what the engine would receive
        def reshard(self, src, dst, on_bucket):
            self.shipped = {k: v.clone() for k, v in src.items()}
            return dst, None

    bridge = Bridge()
    RolloutRole(mesh, None, bridge, None, torch.device("cpu")).sync(actor)
    return {"shipped": bridge.shipped, "expected": expected, "moved": moved,
            "restored": all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters()),
            "adapted": {f"{name}.weight" for name, _ in adapter_modules(model)}}


def test_sync_ships_merged_weights_and_restores_the_base(tmp_path):
    hf = save_tiny_model("llama", tmp_path, seed=3)
    ids = token_batch(hf.config.vocab_size, batch=2, seq=SEQ, seed=5)
    for out in run_distributed(_sync_rank, world_size=2, args=(str(tmp_path), ids)):
        assert out["adapted"] and out["restored"] and out["moved"] > 1e-4  # the merge changes what is shipped
        shipped, expected = out["shipped"], out["expected"]
        assert shipped.keys() == expected.keys()
        for key, value in expected.items():
            torch.testing.assert_close(shipped[key], value, rtol=1e-6, atol=1e-7, msg=key)
