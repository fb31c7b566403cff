"""The cost model prices a LoRA update against hand formulas: a frozen base costs its forward and the
activation-gradient backward (2 of full training's 3 forward-equivalents), the adapters their own 6 FLOPs per
weight and token; the DP sync and Adam cover the adapters only; a rollout that holds the adapters is synced with
their bytes. The config path counts the adapters from roles.actor.lora."""

from dataclasses import replace

import pytest

from hybridflow.config import load_experiment
from hybridflow.config.cluster import ClusterConfig
from hybridflow.placement.auto.cost_model import generation_breakdown, training_breakdown
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.from_config import workload_from_config
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import Workload
from tests.placement.auto.paper_workload import LLAMA_SHAPES, ppo_roles

A100 = DeviceSpec.from_cluster(ClusterConfig(nodes=1, gpus_per_node=8, gpu_type="A100"))
EFF = replace(Efficiency(), role_pass_overhead_s=0.0, forward_host_s_per_layer=0.0, train_host_s_per_layer=0.0,
              optimizer_host_s_per_layer=0.0)
RANK = 32


def _hand_adapters(m) -> int:
    """rank x (in + out) per HF projection (q, k, v, o, gate, up, down) of every layer."""
    h, f, q, kv = m.hidden_size, m.intermediate_size, m.q_dim, m.num_kv_heads * m.head_dim
    return m.num_layers * RANK * ((h + q) + 2 * (h + kv) + (q + h) + 2 * (h + f) + (f + h))


def _workload(adapters: int, syncs: bool) -> Workload:
    m = LLAMA_SHAPES["7b"]
    roles = tuple(replace(r, adapter_params=adapters, syncs_adapters=syncs) if r.name == "actor" else r
                  for r in ppo_roles(m, None, None))
    return Workload(roles, 64, 1, 512, 512, mini_batch_size=16, rollout_engine="vllm")


def test_lora_update_is_two_thirds_of_the_base_plus_the_adapters_and_adam_over_adapters():
    m = LLAMA_SHAPES["7b"]
    adapters = _hand_adapters(m)
    assert m.lora_params(RANK, ("qkv", "proj", "fc1", "fc2")) == adapters
    wl, full = _workload(adapters, True), _workload(0, False)
    h, kv, seq = m.hidden_size, m.num_kv_heads * m.head_dim, wl.sequence_length
    matmuls = m.num_layers * (2 * h * h + 2 * h * kv + 3 * h * m.intermediate_size) + m.vocab_size * h
    forward = 2 * matmuls + 4 * m.num_layers * h * seq / 2  # FLOPs per token, causal mean context
    tokens = wl.samples * seq
    rate = 8 * A100.peak_flops * EFF.train_mfu
    s, steps = Strategy(1, 1, 8), wl.samples / wl.mini_batch_size
    lora = training_breakdown(wl.role("actor"), s, wl, A100, EFF)
    assert lora["compute"] == pytest.approx(tokens * (2 * forward + 6 * adapters) / rate, rel=1e-9)
    dense = training_breakdown(full.role("actor"), s, full, A100, EFF)
    assert dense["compute"] == pytest.approx(tokens * 3 * forward / rate, rel=1e-9)
    # Adam over the adapters' DP shard; the distributed optimizer's 3 bytes per adapter weight, 8-GPU ring
    adam = adapters / 8 * 32 / (A100.hbm_bytes_per_s * EFF.hbm_efficiency)
    assert lora["optimizer"] == pytest.approx(steps * adam, rel=1e-9)
    ring = 2 * 7 / 8 * adapters * 3 / (A100.intra_bytes_per_s * EFF.nvlink_efficiency) + 14 * EFF.nvlink_latency_s
    assert lora["dp_sync"] == pytest.approx(steps * ring * (1 - EFF.dp_overlap), rel=1e-9)
    assert lora["optimizer"] < dense["optimizer"] / 50 and lora["dp_sync"] < dense["dp_sync"] / 20


def test_a_rollout_holding_the_adapters_is_synced_with_their_bytes():
    m = LLAMA_SHAPES["7b"]
    adapters = _hand_adapters(m)
    s = Strategy(2, 1, 1, gen_tp=1)  # micro-DP groups of 2: each rank receives half of what is shipped
    shipped = {}
    for name, syncs in (("adapters", True), ("merged", False)):
        wl = _workload(adapters, syncs)
        shipped[name] = generation_breakdown(wl.role("actor"), s, wl, A100, EFF, 40e9)["bridge"]
    link = A100.intra_bytes_per_s * EFF.nvlink_efficiency
    assert shipped["adapters"] == pytest.approx(adapters * 2 / 2 / link + EFF.nvlink_latency_s, rel=1e-9)
    assert shipped["merged"] == pytest.approx(m.params * 2 / 2 / link + EFF.nvlink_latency_s, rel=1e-9)


def test_config_workload_counts_the_actors_adapters():
    cfg = load_experiment("tiny_cpu", ["roles.actor.lora.rank=8", "roles.actor.lora.target_modules=[qkv,fc2]"])
    actor = workload_from_config(cfg).role("actor")
    m = actor.model
    h, q, kv = m.hidden_size, m.q_dim, m.num_kv_heads * m.head_dim
    assert actor.adapter_params == m.num_layers * 8 * ((h + q) + 2 * (h + kv) + (m.intermediate_size + h))
    assert actor.syncs_adapters  # the native engine takes them
    assert workload_from_config(load_experiment("tiny_cpu")).role("actor").adapter_params == 0
