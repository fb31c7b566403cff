"""The planner with LoRA counts what exists: the base weights once (no grads, no optimizer state), the adapters
with their grads, fp32 masters and Adam states, and no reference model (the reference is the actor with its
adapters off). The adapter count is the one megatron_adapters builds; the issue's 8B GRPO on one H100 plans."""

from __future__ import annotations

import torch.distributed as dist

from hybridflow.config import load_experiment
from hybridflow.placement.config_plan import plan_placement
from hybridflow.placement.host_memory import offloaded_optimizer_bytes
from hybridflow.placement.memory import (
    GRAD_BYTES,
    estimate_role_memory,
    stage_adapter_params,
    stage_params,
    stage_trained_params,
)
from hybridflow.placement.mesh import ParallelDims, RoleMesh
from tests.distributed_harness import run_distributed
from tests.megatron_adapters.tiny_hf_models import save_tiny_model
from tests.placement.test_plan_cli import run_plan

GQA = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=2,
           intermediate_size=96)


def _adapter_numel(path, targets):
    from megatron_adapters.lora import LoraSettings, is_adapter_param
    from megatron_adapters.model import build_gpt
    from megatron_adapters.process_groups import build_role_groups

    out = {}
    for tp in (1, 2):
        lora = LoraSettings(rank=4, alpha=8.0, target_modules=tuple(f"linear_{t}" for t in targets))
        groups = build_role_groups([0, 1], tp=tp, pp=1, dp=2 // tp)
        model = build_gpt(path, groups, spec="sdpa", lora=lora)
        critic = build_gpt(path, groups, head="value", spec="sdpa", lora=lora)
        out[tp] = (sum(p.numel() for p in model.parameters() if is_adapter_param(p)),
                   sum(p.numel() for p in model.parameters() if p.requires_grad),
                   sum(p.numel() for p in critic.parameters() if p.requires_grad))
    dist.barrier()
    return out


def test_adapter_count_is_the_built_models(tmp_path):
    save_tiny_model("qwen3", tmp_path, **GQA)  # head_dim 32 != 64 / 4: q_dim apart from hidden
    for targets in (["qkv", "proj", "fc1", "fc2"], ["qkv", "fc2"]):
        cfg = load_experiment("tiny_cpu", [f"model.path={tmp_path}", "roles.actor.lora.rank=4",
                                           f"roles.actor.lora.target_modules=[{','.join(targets)}]"])
        cfg.roles.critic.lora = cfg.roles.actor.lora
        built = run_distributed(_adapter_numel, 2, args=(str(tmp_path), targets))[0]
        for tp, (adapters, actor_trained, critic_trained) in built.items():
            assert stage_adapter_params(cfg.model, cfg.roles.actor, tp, 1) == adapters, (targets, tp)
            assert stage_trained_params(cfg.model, "actor", cfg.roles.actor, tp, 1, 0) == actor_trained == adapters
            # the critic's scalar head trains with its adapters
            assert stage_trained_params(cfg.model, "critic", cfg.roles.critic, tp, 1, 0) == critic_trained
            assert critic_trained == adapters + cfg.model.hidden_size


def test_lora_memory_parts():
    # (no sequence parallelism in either: a model with adapters is built without it)
    # bf16 on the CPU backend: planned, not run (no parity gate)
    full = load_experiment("tiny_cpu", ["model.dtype=bf16", "trainer.parity_every=0",
                                        "roles.actor.parallel.sequence_parallel=false"])
    lora = load_experiment("tiny_cpu", ["model.dtype=bf16", "trainer.parity_every=0", "roles.actor.lora.rank=8"])
    dims = RoleMesh("actor", (0, 1, 2, 3), ParallelDims(2, 1, 2))
    params = stage_params(lora.model, "actor", 2, 1, 0)
    adapters = stage_adapter_params(lora.model, lora.roles.actor, 2, 1)
    assert 0 < adapters < params
    ft, la = (estimate_role_memory(c.model, "actor", dims, c) for c in (full, lora))
    assert ft.weights == 2 * params and la.weights == 2 * (params + adapters)
    assert ft.grads == GRAD_BYTES * params and la.grads == GRAD_BYTES * adapters
    assert la.optimizer == 12 * adapters / 2 and ft.optimizer == 12 * params / 2  # master + 2 moments, over DP
    assert la.activations == ft.activations
    # the reference: its own weights under full fine-tuning, none as the actor with adapters off
    ref_ft, ref_la = (estimate_role_memory(c.model, "ref", dims, c) for c in (full, lora))
    assert ref_ft.weights == 2 * params and ref_la.weights == 0 and ref_la.activations == ref_ft.activations
    # the critic keeps full fine-tuning unless it has adapters of its own
    assert estimate_role_memory(lora.model, "critic", dims, lora) == estimate_role_memory(full.model, "critic",
                                                                                          dims, full)
    # host: an offloaded optimizer holds the adapters' share only
    mesh = dims
    offload = ["roles.actor.offload_optimizer=true", "roles.actor.offload_fraction=1.0"]
    host_ft = offloaded_optimizer_bytes(load_experiment("tiny_cpu", offload), "actor", mesh, 0)
    host_la = offloaded_optimizer_bytes(load_experiment("tiny_cpu", [*offload, "roles.actor.lora.rank=8"]),
                                        "actor", mesh, 0)
    assert host_ft == 16 * params / 2 and host_la == 16 * adapters / 2


ISSUE_8B = ["+experiment=ppo_llama_1b_h200", "model=llama3_8b", "algorithm=grpo", "roles.critic.enabled=false",
            "roles.actor.offload_optimizer=true", "cluster.gpu_type=H100", "rollout.n_samples_per_prompt=4",
            "data.train_batch_size=12", "algorithm.mini_batch_size=48", "roles.actor.micro_batch_size=1"]


def test_8b_grpo_on_one_h100_plans_with_lora_only(tmp_path):
    refused = run_plan(ISSUE_8B, tmp_path)
    assert refused.returncode == 2 and "error: cluster.gpu_memory_gib: GPU 0 (node 0) needs" in refused.stderr
    assert "ref " in refused.stderr and not (tmp_path / "plan.json").exists()
    accepted = run_plan([*ISSUE_8B, "roles.actor.lora.rank=32"], tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    plan = plan_placement(load_experiment(ISSUE_8B[0].split("=")[1], [*ISSUE_8B[1:], "roles.actor.lora.rank=32"]))
    ref, actor = plan.role_memory[0]["ref"], plan.role_memory[0]["actor"]
    assert ref.weights == ref.grads == ref.optimizer == 0 and ref.activations > 0
    assert actor.grads < actor.weights / 10  # adapters only: rank 32 is ~1% of 8B


def test_auto_search_puts_the_reference_on_the_actor():
    from hybridflow.placement.auto.from_config import workload_from_config

    cfg = load_experiment("tiny_cpu", ["placement=auto", "roles.actor.lora.rank=8"])
    plan = plan_placement(cfg)
    ref, actor = plan.meshes["ref"], plan.meshes["actor"]
    assert (ref.ranks, ref.tp, ref.pp, ref.dp) == (actor.ranks, actor.tp, actor.pp, actor.dp)
    assert plan.role_memory[actor.ranks[0]]["ref"].weights == 0
    # not searched as a role: its log-prob pass is the actor's second preparation pass
    lora, full = workload_from_config(cfg), workload_from_config(load_experiment("tiny_cpu", ["placement=auto"]))
    assert "ref" not in lora.role_names and lora.role("actor").preparation_passes == 2
    assert "ref" in full.role_names and full.role("actor").preparation_passes == 1
    from dataclasses import replace

    from hybridflow.placement.auto.cost_model import inference_breakdown
    from hybridflow.placement.auto.device import DeviceSpec, efficiency_for
    from hybridflow.placement.auto.strategy import Strategy

    device, eff, s = DeviceSpec.from_cluster(cfg.cluster), efficiency_for(cfg.cluster.gpu_type), Strategy(2, 1, 2, 0)
    one = inference_breakdown(full.role("actor"), s, full, device, eff)
    two = inference_breakdown(replace(full.role("actor"), preparation_passes=2), s, full, device, eff)
    assert one and two == {part: 2 * seconds for part, seconds in one.items()}


def test_adapted_models_count_activations_without_sequence_parallelism():
    # adapters replace megatron-core's local linears: no Transformer Engine spec, so no sequence parallelism
    dims = RoleMesh("actor", (0, 1, 2, 3), ParallelDims(2, 1, 2))
    sp, lora = (load_experiment("tiny_cpu", [*extra, "roles.actor.parallel.sequence_parallel=true"])
                for extra in ((), ("roles.actor.lora.rank=8",)))
    no_sp = load_experiment("tiny_cpu", ["roles.actor.parallel.sequence_parallel=false"])
    for role in ("actor", "ref"):
        with_sp, adapted, without = (estimate_role_memory(c.model, role, dims, c) for c in (sp, lora, no_sp))
        assert with_sp.activations < without.activations == adapted.activations, role
