"""`roles.<role>.activation_recompute`, `parallel.sequence_parallel` and `offload_optimizer` reach the runtime.

CPU (gloo) checks: a trained role built with "full" recompute carries megatron's recompute fields in its
TransformerConfig, one with "selective" none (its SDPA core attention keeps no scores to drop), and the loss
and gradients of both equal those of a "none" role to 1e-6 (the recomputed forward is the same arithmetic;
TP2). The override mapping itself is checked in-process, including the sequence-parallel rules (on only with
tp > 1, the "te" spec and off the CPU backend) that the CPU ranks cannot exercise.
"""

import pytest
import torch

import hybridflow.roles.model_role as model_role
from hybridflow.config.parallel import RECOMPUTE_MODES
from hybridflow.roles.model_role import RECOMPUTE_OVERRIDES, role_config_overrides
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model, token_batch

RECOMPUTE_FIELDS = ("recompute_granularity", "recompute_method", "recompute_num_layers")


def test_every_configurable_recompute_mode_has_overrides_and_no_other():
    # config (which may not import roles) owns the names the planner accepts; roles owns what each one means
    assert tuple(RECOMPUTE_OVERRIDES) == RECOMPUTE_MODES


def test_recompute_overrides_for_trained_roles_only():
    assert role_config_overrides(True, 1, "none") == {}
    # selective: megatron checkpoints the core attention only where it keeps a*s scores (the unfused "local"
    # spec); the fused kernels of "sdpa" and "te" keep none, so recomputing them would only cost time
    assert role_config_overrides(True, 1, "selective", spec="local") == {"recompute_granularity": "selective"}
    assert role_config_overrides(True, 1, "selective", spec="sdpa") == {}
    assert role_config_overrides(True, 1, "selective", spec="te") == {}
    assert role_config_overrides(True, 1, "full") == {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1,
    }
    assert role_config_overrides(False, 1, "full") == {}  # ref / reward: no backward, nothing to recompute
    with pytest.raises(ValueError, match="activation_recompute"):
        role_config_overrides(True, 1, "some")


def test_selective_recompute_stays_for_packed_attention_off_the_varlen_kernel(monkeypatch):
    # packed micro-batches off torch's varlen kernel run a masked SDPA, which keeps its [t, t] mask in every layer
    # (on the CPU its attention weights): there megatron's core-attention checkpoint still saves memory
    from megatron_adapters.sdpa_attention import varlen_attn, varlen_kernel_runs

    assert varlen_kernel_runs(torch.bfloat16, on_cuda=True) == (varlen_attn is not None)
    assert not varlen_kernel_runs(torch.float32, on_cuda=True) and not varlen_kernel_runs(torch.bfloat16, False)
    selective = {"recompute_granularity": "selective"}
    monkeypatch.setattr(model_role, "varlen_kernel_runs", lambda dtype, on_cuda: on_cuda and dtype == torch.bfloat16)
    monkeypatch.setattr(model_role, "is_cpu_backend_enabled", lambda: False)
    assert role_config_overrides(True, 1, "selective", spec="sdpa", packed_dtype=torch.bfloat16) == {}
    assert role_config_overrides(True, 1, "selective", spec="sdpa", packed_dtype=torch.float32) == selective
    assert role_config_overrides(True, 1, "selective", spec="sdpa") == {}  # padded rows: causal, no mask
    assert role_config_overrides(False, 1, "selective", spec="sdpa", packed_dtype=torch.float32) == {}
    monkeypatch.setattr(model_role, "is_cpu_backend_enabled", lambda: True)
    assert role_config_overrides(True, 1, "selective", spec="sdpa", packed_dtype=torch.bfloat16) == selective


def test_sequence_parallel_needs_tp_te_and_a_gpu(monkeypatch):
    monkeypatch.setattr(model_role, "resolve_spec_name", lambda spec: "te")
    monkeypatch.setattr(model_role, "is_cpu_backend_enabled", lambda: False)
    assert role_config_overrides(False, 2, "none", sequence_parallel=True) == {"sequence_parallel": True}
    assert role_config_overrides(True, 2, "none", sequence_parallel=False) == {}
    assert role_config_overrides(True, 1, "none", sequence_parallel=True) == {}
    monkeypatch.setattr(model_role, "is_cpu_backend_enabled", lambda: True)
    assert role_config_overrides(True, 2, "none", sequence_parallel=True) == {}
    monkeypatch.setattr(model_role, "is_cpu_backend_enabled", lambda: False)
    monkeypatch.setattr(model_role, "resolve_spec_name", lambda spec: "sdpa")  # torch norms reject SP
    assert role_config_overrides(True, 2, "none", sequence_parallel=True) == {}


def _grads_per_recompute(hf_dir: str, ids: torch.Tensor) -> dict:
    import torch.distributed as dist
    from megatron.core import tensor_parallel

    from hybridflow.placement import ParallelDims, RoleMesh
    from hybridflow.roles.model_role import (
        OptimizerSettings,
        build_model_role,
        role_config_overrides,
    )
    from megatron_adapters.checkpoint import unwrap
    from megatron_adapters.forward_backward import run_forward_backward
    from megatron_adapters.process_groups import build_role_groups

    calls = []
    checkpoint = tensor_parallel.checkpoint

    def counting_checkpoint(*args, **kwargs):  # megatron's recompute entry (attention.py, transformer_block.py)
        calls.append(1)
        return checkpoint(*args, **kwargs)

    tensor_parallel.checkpoint = counting_checkpoint
    world = dist.get_world_size()
    groups = build_role_groups(list(range(world)), tp=world, pp=1, dp=1)
    mesh = RoleMesh("actor", tuple(range(world)), ParallelDims(world, 1, 1))
    out = {}
    for mode in RECOMPUTE_OVERRIDES:
        overrides = role_config_overrides(True, world, mode, sequence_parallel=True)  # SP: off on CPU
        role = build_model_role("actor", mesh, groups, hf_dir, "lm", torch.float32, 2,
                                optimizer=OptimizerSettings(lr=1e-3, offload_optimizer=True), **overrides)
        model = unwrap(role.model)
        config = model.config

        def loss_fn(logits, mb, role=role):
            loss = -role.logprobs(logits, mb["input_ids"])[:, 1:].mean()
            return loss, {"loss": loss.detach()}

        role.model.train()
        role.optimizer.zero_grad()
        calls.clear()
        metrics = run_forward_backward([role.model], groups, role.micro_batches({"input_ids": ids}), loss_fn)
        out[mode] = {
            "config": {f: getattr(config, f) for f in (*RECOMPUTE_FIELDS, "recompute_modules", "sequence_parallel")},
            "checkpoints": len(calls),
            "cpu_offload": role.optimizer.optimizer.config.optimizer_cpu_offload,
            "checkpoint_core_attention": model.decoder.layers[0].self_attention.checkpoint_core_attention,
            "loss": torch.stack([m["loss"] for m in metrics]),
            "grads": {n: p.main_grad.detach().clone() for n, p in model.named_parameters()},
        }
    return out


def test_recompute_matches_no_recompute_tp2(tmp_path):
    hf = save_tiny_model("llama", tmp_path)
    ids = token_batch(hf.config.vocab_size, batch=4, seq=16, seed=3)
    results = run_distributed(_grads_per_recompute, world_size=2, args=(str(tmp_path), ids))
    for rank_out in results:
        none, selective, full = rank_out["none"], rank_out["selective"], rank_out["full"]
        assert none["config"]["recompute_granularity"] is None
        assert not none["checkpoint_core_attention"]
        assert none["checkpoints"] == 0
        # one checkpoint per layer (full) per micro-batch (4 rows / 2); none for selective: SDPA keeps no scores
        assert full["checkpoints"] == 2 * hf.config.num_hidden_layers
        assert selective["checkpoints"] == 0
        assert selective["config"]["recompute_granularity"] is None
        assert not selective["checkpoint_core_attention"]
        assert {f: full["config"][f] for f in RECOMPUTE_FIELDS} == dict(RECOMPUTE_OVERRIDES["full"])
        assert not full["checkpoint_core_attention"]
        for other in (selective, full):
            assert other["config"]["sequence_parallel"] is False
            assert other["cpu_offload"] is False  # offload_optimizer is dropped on the CPU backend
            torch.testing.assert_close(other["loss"], none["loss"], rtol=0, atol=1e-6)
            assert other["grads"].keys() == none["grads"].keys()
            for name, grad in none["grads"].items():
                assert grad.abs().max() > 0, name
                torch.testing.assert_close(other["grads"][name], grad, rtol=0, atol=1e-6, msg=name)


def _offload_optimizer_config(bf16: bool, fraction: float = 1.0) -> dict:
    from megatron_adapters.optimizer import OptimizerSettings, TrainingPrecision, build_optimizer, wrap_for_training
    from megatron_adapters.process_groups import build_role_groups, seed_role_rng
    from tests.megatron_adapters import tiny_gpt

    dtype = torch.bfloat16 if bf16 else torch.float32
    groups = build_role_groups([0], tp=1, pp=1, dp=1)
    seed_role_rng(5, groups)
    ddp = wrap_for_training([tiny_gpt.tiny_gpt(groups, params_dtype=dtype, bf16=bf16)], groups)
    try:
        settings = OptimizerSettings(lr=1e-3, offload_optimizer=True, offload_fraction=fraction)
        opt = build_optimizer(ddp, groups, settings, TrainingPrecision(dtype, bf16=bf16))
    except ValueError as e:
        return {"error": str(e)}
    config = opt.optimizer.config
    return {
        "inner": type(opt.optimizer.optimizer).__name__,
        **{f: getattr(config, f) for f in
           ("optimizer_cpu_offload", "optimizer_offload_fraction", "use_precision_aware_optimizer")},
    }


def test_offload_optimizer_builds_megatrons_hybrid_device_optimizer():
    """Build only: its step needs CUDA params (HybridDeviceOptimizer copies GPU params to host)."""
    assert run_distributed(_offload_optimizer_config, world_size=1, args=(True,))[0] == {
        "inner": "HybridDeviceOptimizer", "optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
        "use_precision_aware_optimizer": True,
    }
    assert "bf16" in run_distributed(_offload_optimizer_config, world_size=1, args=(False,))[0]["error"]
    # roles.<role>.offload_fraction (as the plan resolved it) reaches megatron's OptimizerConfig
    partial = run_distributed(_offload_optimizer_config, world_size=1, args=(True, 0.75))[0]
    assert partial["optimizer_offload_fraction"] == 0.75
