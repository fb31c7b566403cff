"""The search on hand-built workloads with a memory callable: memory limits, determinism, constraints."""

from dataclasses import replace

import pytest

from hybridflow.config.cluster import ClusterConfig
from hybridflow.errors import UserError
from hybridflow.placement.auto.device import DeviceSpec
from hybridflow.placement.auto.search import search
from hybridflow.placement.auto.workload import Workload
from tests.placement.auto.paper_workload import LLAMA_SHAPES, ppo_roles

GIB = 2**30
DEVICE = DeviceSpec.from_cluster(ClusterConfig(nodes=4, gpus_per_node=8, gpu_type="A100"))


def workload(size="7b"):
    m = LLAMA_SHAPES[size]
    return Workload(ppo_roles(m, replace(m, head="value"), replace(m, head="reward")), 256, 1, 1024, 1024, 64,
                    rollout_engine="vllm")


def simple_memory(wl, per_param_trained=16.0, per_param_frozen=2.0):
    """A stand-in estimator: bytes/param over the model-parallel size, plus a rollout KV budget."""
    def memory(role, s):
        r = wl.role(role)
        per = per_param_trained if r.trains else per_param_frozen
        total = r.model.params * per / (s.tp * s.pp)
        if s.gen_tp:
            return total + 10 * GIB, 10 * GIB
        return total, 0.0
    return memory


def test_chosen_plan_fits_memory_and_covers_every_gpu_and_role():
    wl = workload()
    memory = simple_memory(wl)
    result = search(wl, DEVICE, memory)
    chosen = result.chosen
    assert sorted(r for s in chosen.sets for r in s.roles) == sorted(wl.role_names)
    assert sorted(g for r in chosen.ranks for g in r) == list(range(DEVICE.world_size))
    for s in chosen.sets:
        assert sum(memory(c.role, c.strategy)[0] for c in s.choices) <= DEVICE.memory_bytes
        assert all(c.strategy.gpus == s.gpus for c in s.choices)
    # Stage cost: sum within a set, max across sets.
    for stage, t in chosen.stage_times.items():
        per_set = [sum(c.stage_times.get(stage, 0) for c in s.choices) for s in chosen.sets]
        assert t == pytest.approx(max(per_set))
    assert result.partitions[0].best is chosen
    assert len(result.partitions) == 15


def test_every_candidate_of_every_partition_fits_memory():
    wl = workload("13b")
    memory = simple_memory(wl, per_param_trained=18.0)
    result = search(wl, DEVICE, memory)
    for p in result.partitions:
        if p.best is None:
            assert p.reason
            continue
        for s in p.best.sets:
            assert s.memory_bytes <= DEVICE.memory_bytes


def test_search_is_deterministic():
    wl = workload()
    a = search(wl, DEVICE, simple_memory(wl))
    b = search(wl, DEVICE, simple_memory(wl))
    assert a.chosen == b.chosen
    assert [p.partition for p in a.partitions] == [p.partition for p in b.partitions]


def test_memory_pressure_pushes_to_more_model_parallelism_or_apart():
    wl = workload("13b")
    roomy = search(wl, DEVICE, simple_memory(wl, per_param_trained=4.0)).chosen
    tight = search(wl, DEVICE, simple_memory(wl, per_param_trained=40.0)).chosen
    def mp(c):
        return sorted(ch.strategy.tp * ch.strategy.pp for s in c.sets for ch in s.choices)
    assert mp(tight) != mp(roomy) and sum(mp(tight)) > sum(mp(roomy))


def test_nothing_fits_raises_user_error_naming_placement():
    wl = workload("70b")
    with pytest.raises(UserError, match="placement: no placement"):
        search(wl, DeviceSpec.from_cluster(ClusterConfig(nodes=1, gpus_per_node=8, gpu_type="A100")),
               simple_memory(wl, per_param_trained=16.0))


def test_must_share_groups_stay_in_one_set():
    wl = workload()
    result = search(wl, DEVICE, simple_memory(wl), must_share=(("critic", "reward"),))
    for p in result.partitions:
        assert any({"critic", "reward"} <= set(s) for s in p.partition)
