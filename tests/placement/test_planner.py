"""Explicit planner: shipped experiments plan; every bad input names its field; plan invariants hold."""

import dataclasses
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridflow.config import ClusterConfig, conf_dir
from hybridflow.config.cluster import resolve_cluster
from hybridflow.errors import UserError
from hybridflow.placement import GIB, ParallelDims, build_plan, plan_placement
from hybridflow.resolve import resolve_experiment

EXPERIMENTS = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_every_shipped_experiment_plans_within_capacity(name):
    plan = plan_placement(resolve_experiment(name, []))
    assert plan.over_capacity() == []
    assert set(plan.meshes) == set(resolve_experiment(name, []).roles.enabled_roles())
    json.dumps(plan.to_json())  # serialisable


def test_split_placement_plan():
    plan = plan_placement(resolve_experiment("ppo_llama3_8b", []))
    assert plan.meshes["actor"].ranks == (0, 1, 2, 3) and plan.meshes["actor"].tp == 4
    # the zero-redundancy grouping at rollout tp2 under actor tp4: stride-2 groups, as the run builds them
    assert plan.meshes["rollout"].tp_groups() == [(0, 2), (1, 3)]
    assert plan.to_json()["meshes"]["rollout"]["tp_groups"] == [[0, 2], [1, 3]]
    assert plan.meshes["critic"].ranks == (4, 5) and plan.meshes["reward"].ranks == (6, 7)
    assert plan.rank_roles[0] == ("actor", "ref", "rollout") and plan.rank_roles[5] == ("critic",)
    assert plan.colocation_sets == [("actor", "ref", "rollout"), ("critic",), ("reward",)]
    # GPU 0 sums its three roles.
    assert plan.memory[0].total == sum(m.total for m in plan.role_memory[0].values())


def test_rollout_tp_groups_are_the_bridge_generation_groups():
    from megatron_adapters.bridge import build_reshard_plan

    plan = plan_placement(resolve_experiment("ppo_llama3_8b", []))
    actor, rollout = plan.meshes["actor"], plan.meshes["rollout"]
    bridge = build_reshard_plan(actor, rollout)
    assert rollout.tp_groups() == bridge.generation_tp_groups()


@pytest.mark.parametrize("experiment,overrides,groups", [
    ("ppo_llama3_8b", [], [(0, 2), (1, 3)]),  # the seed layout: rollout TP2 under actor TP4 on GPUs 0-3 of 8
    ("ppo_llama3_8b_4gpu", ["roles.rollout.parallel.tp=2"], [(0, 2), (1, 3)]),  # every GPU, strided groups
])
def test_vllm_rollout_on_a_subset_and_below_the_actor_tp_plans(experiment, overrides, groups):
    # vLLM runs in engine processes whose world is the rollout in generation order, so any subset and any
    # TP_g the bridge supports can be served; the plan holds the groups the engines build.
    plan = plan_placement(resolve_experiment(experiment, ["rollout=vllm", *overrides]))
    assert plan.meshes["rollout"].tp_groups() == groups


def test_vllm_rollout_on_every_gpu_at_the_actor_tp_plans():
    plan = plan_placement(resolve_experiment("ppo_llama3_8b_4gpu", []))
    assert plan.meshes["rollout"].ranks == (0, 1, 2, 3) and plan.meshes["rollout"].tp == 4


def test_node_local_lists_and_two_nodes():
    cfg = resolve_experiment("ppo_llama3_70b_2node", [])
    plan = plan_placement(cfg)
    assert plan.world_size == 16 and plan.gpus[9].node == 1 and plan.gpus[9].local_index == 1
    assert plan.meshes["actor"].pp_groups()[0] == (0, 8)  # PP crosses nodes, TP does not
    assert plan.meshes["critic"].ranks == tuple(range(8)) and plan.meshes["reward"].ranks == tuple(range(8, 16))
    cfg = resolve_experiment(
        "ppo_llama3_8b",
        [
            "cluster=2node_8gpu",
            "roles.reward.enabled=false",
            "reward.use_model=false",
            "reward.fn=m:f",
            "placement.resources={actor: ['node0:[0,1,2,3]'], rollout: ['node0:[0,1,2,3]'], critic: ['node1:[0,1]']}",
            "~placement.resources.ref",
        ],
    )
    plan = plan_placement(cfg)
    assert plan.meshes["critic"].ranks == (8, 9)
    assert plan.meshes["ref"].ranks == (0, 1, 2, 3)  # ref defaults to the actor's GPUs


def test_native_rollout_on_actor_layout_shares_weights():
    plan = plan_placement(resolve_experiment("tiny_cpu", []))
    assert plan.role_memory[0]["rollout"].weights == 0
    plan = plan_placement(resolve_experiment("tiny_cpu", ["roles.rollout.parallel.tp=1"]))
    assert plan.role_memory[0]["rollout"].weights > 0


def test_dp_derived_or_checked():
    plan = plan_placement(resolve_experiment("tiny_cpu", ["roles.critic.parallel.dp=4"]))
    assert plan.meshes["critic"].dp == 4
    assert plan_placement(resolve_experiment("tiny_cpu", [])).meshes["actor"].dp == 2


# Each bad input from the issue: (experiment, overrides, expected message start).
BAD_INPUTS = {
    "tp_not_dividing_heads": (
        "ppo_llama3_8b",
        ["roles.critic.parallel.tp=3"],
        r"^roles\.critic\.parallel\.tp: 3 does not divide model\.num_attention_heads=32",
    ),
    "tp_not_dividing_query_groups": (
        "tiny_cpu",
        ["roles.actor.parallel.tp=4"],
        r"^roles\.actor\.parallel\.tp: 4 does not divide model\.num_key_value_heads=2",
    ),
    "tp_not_dividing_the_mlp": (  # before: megatron's build asserted it on every rank
        "tiny_cpu",
        ["model.intermediate_size=385"],
        r"^roles\.actor\.parallel\.tp: 2 does not divide model\.intermediate_size=385; use a divisor",
    ),
    "sequence_parallel_width_not_dividing_tp": (  # before: the rank refused it at build (Transformer Engine)
        "ppo_llama3_8b",
        ["data.seq_length=2050"],
        r"^data\.seq_length: 2050 is not a multiple of roles\.actor\.parallel\.tp=4 \(sequence parallelism",
    ),
    "tp_larger_than_node": (
        "ppo_llama3_70b_2node",
        ["roles.actor.parallel.tp=16", "roles.actor.parallel.pp=1"],
        r"^roles\.actor\.parallel\.tp: 16 exceeds cluster\.gpus_per_node=8",
    ),
    "gpu_out_of_range": (
        "ppo_llama3_8b",
        ["placement.resources.critic=[4,9]"],
        r"^placement\.resources\.critic: GPU 9 is out of range for 8 GPUs",
    ),
    "node_out_of_range": (
        "ppo_llama3_70b_2node",
        ["placement.resources.reward=['node2:all']"],
        r"^placement\.resources\.reward: node2 does not exist \(cluster\.nodes=2\)",
    ),
    "gpu_twice": (
        "ppo_llama3_8b",
        ["placement.resources.critic=[4,4]"],
        r"^placement\.resources\.critic: GPU 4 is listed twice",
    ),
    "count_not_tp_pp_dp": (
        "ppo_llama3_8b",
        ["roles.critic.parallel.dp=2"],
        r"^roles\.critic\.parallel: tp x pp x dp = 2 x 1 x 2 = 4 but placement\.resources\.critic "
        r"has 2 GPUs",
    ),
    "count_not_divisible": (
        "ppo_llama3_8b",
        ["placement.resources.critic=[4,5,6]", "placement.resources.reward=[7]"],
        r"^placement\.resources\.critic: 3 GPUs are not divisible by tp x pp = 2 x 1",
    ),
    "rollout_not_on_actor_gpus": (
        "ppo_llama3_8b",
        ["placement.resources.rollout=[0,1]"],
        r"^placement\.resources\.rollout: \[0, 1\] overlaps the actor's \[0, 1, 2, 3\]",
    ),
    "declared_colocated_differs": (
        "ppo_llama3_8b",
        ["placement.colocate=[[actor,rollout,critic]]"],
        r"^placement\.resources\.critic: \[4, 5\] differs from actor's .*placement\.colocate",
    ),
    "memory_over_capacity": (
        "ppo_llama3_8b_4gpu",
        ["roles.actor.offload_optimizer=false", "roles.critic.offload_optimizer=false"],
        r"^cluster\.gpu_memory_gib: GPU 0 \(node 0\) needs an estimated \d+\.\d GiB "
        r"\(actor \d+\.\d \+ critic .*\) > 74\.0 GiB "
        r"\(80\.0 GiB capacity - 6\.0 GiB cluster\.gpu_memory_headroom_gib\)",
    ),
    "unknown_role": (
        "tiny_cpu",
        ["+placement.resources.actr=[0]"],
        r"^placement\.resources\.actr: unknown role; use one of actor, critic, ref, reward, rollout",
    ),
    "unknown_key": ("tiny_cpu", ["roles.actor.paralel.tp=2"], r"^roles\.actor\.paralel: unknown key"),
    "mini_batch_vs_dp_micro": (
        "tiny_cpu",
        ["roles.actor.micro_batch_size=3"],
        r"^algorithm\.mini_batch_size: 16 is not divisible by actor dp x micro_batch_size = "
        r"2 x 3 = 6",
    ),
    "forward_batch_vs_dp_micro": (
        "tiny_cpu",
        ["roles.ref.micro_batch_size=3"],
        r"^roles\.ref\.micro_batch_size: 32 samples per step are not divisible",
    ),
    "pp_larger_than_layers": (
        "tiny_cpu",
        ["roles.critic.parallel.pp=8"],
        r"^roles\.critic\.parallel\.pp: 8 exceeds model\.num_hidden_layers=4",
    ),
    "pp_not_dividing_layers": (
        "tiny_cpu",
        ["roles.critic.parallel.pp=3"],
        r"^roles\.critic\.parallel\.pp: 3 does not divide model\.num_hidden_layers=4",
    ),
    "missing_role_resources": (
        "tiny_cpu",
        ["~placement.resources.critic"],
        r"^placement\.resources\.critic: no GPUs for enabled role critic",
    ),
    "tp_group_across_nodes": (
        "ppo_llama3_70b_2node",
        ["placement.resources.critic=['node0:4-7','node1:0-3']"],
        r"^placement\.resources\.critic: TP group \[4, 5, 6, 7, 8, 9, 10, 11\] spans nodes",
    ),
    "rollout_lag_with_colocated_rollout": (
        "tiny_cpu",
        ["trainer.rollout_lag=1"],
        r"^trainer\.rollout_lag: 1 generates batch k\+1 while the actor trains on batch k, but the rollout "
        r"shares the actor's GPUs \[0, 1, 2, 3\]; set placement\.resources\.rollout to GPUs the actor does not "
        r"hold \(e\.g\. placement=split_rollout",
    ),
    "rollout_lag_with_vllm": (
        "tiny_cpu",
        ["trainer.rollout_lag=1", "rollout=vllm", "cluster=1node_4gpu"],
        r"^trainer\.rollout_lag: 1 with rollout\.engine=vllm has never run",
    ),
    "vllm_on_a_cpu_cluster": (  # vLLM is GPU-only: the run would refuse it without CUDA
        "tiny_cpu",
        ["rollout=vllm"],
        r"^rollout\.engine: vllm runs on CUDA GPUs only and cluster\.gpu_type is cpu; set rollout\.engine=megatron",
    ),
    "vllm_budget_below_weights": (
        "ppo_llama3_8b",
        [
            "rollout=vllm",
            "rollout.gpu_memory_utilization=0.05",
            "roles.rollout.parallel.tp=1",
            "placement.resources.rollout=[0,1,2,3]",
        ],
        r"^rollout\.gpu_memory_utilization: 0\.05 x 80\.0 GiB",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_field_and_fix(case):
    experiment, overrides, match = BAD_INPUTS[case]
    with pytest.raises(UserError, match=match) as err:
        plan_placement(resolve_experiment(experiment, overrides))
    message = str(err.value)
    assert "\n" not in message and "; " in message, message


def test_prompts_must_split_over_rollout_dp():
    cfg = resolve_experiment(
        "tiny_cpu",
        [
            "data.train_batch_size=5",
            "algorithm.mini_batch_size=5",
            "roles.actor.micro_batch_size=1",
            "roles.critic.micro_batch_size=1",
            "roles.ref.micro_batch_size=1",
        ],
    )
    ranks = {"actor": [0], "ref": [0], "critic": [1], "rollout": [2, 3]}
    one = ParallelDims(1, 1, 1)
    dims = {"actor": one, "ref": one, "critic": one, "rollout": ParallelDims(1, 1, 2)}
    with pytest.raises(UserError, match=r"^data\.train_batch_size: 5 prompts do not split over the rollout's dp=2"):
        build_plan(cfg, ranks, dims)
    dims["rollout"] = ParallelDims(2, 1, 1)
    assert build_plan(cfg, ranks, dims).meshes["rollout"].tp_groups() == [(2, 3)]


def test_memory_check_can_be_disabled():
    cfg = resolve_experiment(
        "ppo_llama3_8b_4gpu",
        [
            "roles.actor.offload_optimizer=false",
            "roles.critic.offload_optimizer=false",
            "placement.check_memory=false",
        ],
    )
    plan = plan_placement(cfg)
    assert plan.over_capacity() == [0, 1, 2, 3]
    assert plan.memory[0].total > 80 * GIB


# --- properties over random valid layouts --------------------------------------------------------------


@pytest.fixture(scope="module")
def base_cfg():
    # Large, highly divisible batch so any dp up to 24 divides it; memory is not the point here.
    return resolve_experiment(
        "tiny_cpu",
        [
            "model.num_attention_heads=8",
            "model.num_key_value_heads=8",
            "model.num_hidden_layers=12",
            "model.hidden_size=64",
            "data.train_batch_size=720720",
            "algorithm.mini_batch_size=720720",
            "roles.actor.micro_batch_size=1",
            "roles.critic.micro_batch_size=1",
            "roles.ref.micro_batch_size=1",
            "roles.reward.micro_batch_size=1",
            "placement.check_memory=false",
            "roles.reward.enabled=true",
            "reward.use_model=true",
        ],
    )


@st.composite
def layouts(draw):
    nodes = draw(st.integers(1, 3))
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    ranks, dims = {}, {}
    for role in ("actor", "critic", "ref", "reward", "rollout"):
        tp = draw(st.sampled_from([t for t in (1, 2, 4, 8) if t <= gpn]))
        blocks = [(n * gpn + i * tp) for n in range(nodes) for i in range(gpn // tp)]  # TP-aligned blocks
        pp = draw(st.sampled_from([p for p in (1, 2, 3, 4) if p <= len(blocks)]))
        dp = draw(st.integers(1, min(16, len(blocks) // pp)))  # 720720 is divisible by 1..16
        chosen = draw(st.permutations(blocks))[: pp * dp]
        ranks[role] = [b + t for b in chosen for t in range(tp)]
        dims[role] = ParallelDims(tp=tp, pp=pp, dp=dp)
    if set(ranks["rollout"]) & set(ranks["actor"]):
        ranks["rollout"], dims["rollout"] = ranks["actor"], dims["actor"]
    return nodes, gpn, ranks, dims


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(layout=layouts())
def test_plan_properties(base_cfg, layout):
    nodes, gpn, ranks, dims = layout
    cluster = resolve_cluster(ClusterConfig(nodes=nodes, gpus_per_node=gpn, gpu_type="H100"))
    cfg = dataclasses.replace(base_cfg, cluster=cluster)
    plan = build_plan(cfg, ranks, dims)
    for mesh in plan.meshes.values():
        assert len(set(mesh.ranks)) == len(mesh.ranks) == mesh.tp * mesh.pp * mesh.dp  # distinct ranks
        for group in mesh.tp_groups():
            assert len({plan.gpus[r].node for r in group}) == 1  # TP never crosses nodes
    for rank, roles in plan.rank_roles.items():  # rank -> roles and role -> ranks agree
        assert set(roles) == {role for role, mesh in plan.meshes.items() if rank in mesh.ranks}
    for role, mesh in plan.meshes.items():
        assert all(role in plan.rank_roles[r] for r in mesh.ranks)
    assert sorted(r for s in plan.colocation_sets for r in s) == sorted(plan.meshes)
    assert build_plan(cfg, ranks, dims).to_json() == plan.to_json()  # deterministic


def test_rollout_lag_plans_on_a_split_rollout():
    plan = plan_placement(resolve_experiment("tiny_cpu", ["trainer.rollout_lag=1", "placement=split_rollout"]))
    assert plan.meshes["actor"].ranks == (0, 1) and set(plan.meshes["rollout"].ranks) == {2, 3}


@pytest.mark.parametrize("override", ["data.seq_length=2049", "model.intermediate_size=14339"])
def test_the_auto_search_offers_only_tps_the_layout_checks_accept(override):
    # Before: the search took TP 2 (it checked heads only) and build_plan refused its own choice, naming
    # roles.actor.parallel.tp, which the user never set.
    plan = plan_placement(resolve_experiment("ppo_llama3_8b", ["placement.mode=auto", override]))
    sequence_split = ("actor", "critic", "ref", "reward") if override.startswith("data.") else tuple(plan.meshes)
    assert all(plan.meshes[role].tp == 1 for role in sequence_split if role in plan.meshes)
