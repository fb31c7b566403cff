"""Host memory per node, the planner's choice of the optimizer share offloaded, and the GPU headroom."""

import pytest

from hybridflow.config import load_experiment
from hybridflow.engines.vllm import VLLM_ENGINE_PROCESS_GIB
from hybridflow.errors import UserError
from hybridflow.placement import GIB, plan_placement
from hybridflow.placement.host_memory import NODE_SYSTEM_GIB, TRAINING_PROCESS_GIB
from hybridflow.placement.memory import stage_params
from hybridflow.placement.report import format_plan

# The case that was SIGKILLed on the H200 (128 GiB host memory) at its first RL step with the whole
# optimizer offloaded: 8B Llama GRPO on one GPU.
CASE_8B = ["model=llama3_8b", "algorithm=grpo", "roles.critic.enabled=false", "rollout.n_samples_per_prompt=4",
           "data.train_batch_size=16", "roles.actor.offload_optimizer=true", "rollout.max_new_tokens=512",
           "data.seq_length=1536"]
NO_CHECKPOINT = ["trainer.save_last=false"]  # an 8B checkpoint's staging (weights + the GPU's optimizer share)


def _case(*extra):
    return load_experiment("ppo_llama_1b_h200", [*CASE_8B, *extra])


def test_whole_optimizer_offloaded_is_refused_with_the_host_numbers():
    cfg = _case("roles.actor.offload_fraction=1.0")
    with pytest.raises(UserError, match=r"^cluster\.host_memory_gib: node 0 needs an estimated (\d+\.\d) GiB") as e:
        plan_placement(cfg)
    params = stage_params(cfg.model, "actor", 1, 1, 0)
    # fp32 master + Adam m, v + pinned fp32 grads = 16 B/param; the rank's process and the node's system;
    # the final HF export (bf16 weights); the embedding read twice at load
    expected = (16 * params + 2 * params + 2 * 2 * 128 * 1024 * 4096) / GIB + TRAINING_PROCESS_GIB + NODE_SYSTEM_GIB
    assert float(e.value.args[0].split("estimated ")[1].split(" GiB")[0]) == pytest.approx(expected, abs=0.06)
    assert "> 128.0 GiB" in str(e.value) and "offload_fraction" in str(e.value) and "\n" not in str(e.value)


def test_the_final_checkpoint_is_host_memory_and_the_refusal_names_save_last():
    # the loop writes a dist checkpoint after the last step unless trainer.save_last=false; its staging holds the
    # weights (bf16, 2 B/param) and the GPU-resident optimizer share (12 B/param x (1 - share)) in host memory
    with pytest.raises(UserError, match=r"^cluster\.host_memory_gib: node 0 .*trainer\.save_last=false") as e:
        plan_placement(_case())
    params = stage_params(_case().model, "actor", 1, 1, 0)
    share = plan_placement(_case(*NO_CHECKPOINT)).offload_fractions["actor"]
    staged = float(str(e.value).split("checkpoint ")[1].split(" ")[0])
    assert staged == pytest.approx((2 + 12 * (1 - share)) * params / GIB, abs=0.06)
    assert "\n" not in str(e.value)


def test_the_8b_case_plans_with_a_partial_offload_that_fits_gpu_and_host():
    plan = plan_placement(_case(*NO_CHECKPOINT))  # offload_fraction unset: the planner picks it
    share = plan.offload_fractions["actor"]
    assert 0 < share < 1
    assert plan.over_capacity() == [] and plan.memory[0].total <= plan.usable_bytes
    assert plan.host_over_capacity() == [] and plan.host_memory[0].total <= 128 * GIB
    params = stage_params(_case().model, "actor", 1, 1, 0)
    assert plan.host_memory[0].checkpoint == 2 * params  # only the final HF export (bf16)
    assert plan.host_memory[0].optimizer == pytest.approx(16 * share * params, rel=1e-9)
    assert plan.role_memory[0]["actor"].optimizer == pytest.approx(12 * (1 - share) * params, rel=1e-9)
    # the smallest share in steps of 0.05: 0.05 less does not fit the GPU
    with pytest.raises(UserError, match=r"^cluster\.gpu_memory_gib: GPU 0"):
        plan_placement(_case(*NO_CHECKPOINT, f"roles.actor.offload_fraction={share - 0.05:.2f}"))
    table = format_plan(plan)
    assert "host memory per node" in table and f"actor {share:g}" in table


def test_no_offload_needed_picks_zero_and_the_runtime_gets_no_offload():
    plan = plan_placement(load_experiment("ppo_llama_1b_h200", ["roles.actor.offload_optimizer=true"]))
    assert plan.offload_fractions == {"actor": 0.0}
    assert plan.role_memory[0]["actor"].optimizer > 0 and plan.host_memory[0].optimizer == 0


def test_sleeping_vllm_weights_and_its_engine_process_are_host_memory():
    def host(level):
        cfg = load_experiment("ppo_llama_1b_h200", ["rollout=vllm", f"rollout.sleep_level={level}"])
        return cfg, plan_placement(cfg).host_memory[0]

    cfg, level1 = host(1)
    _, level2 = host(2)
    assert level1.rollout == stage_params(cfg.model, "rollout", 1, 1, 0) * 2  # bf16 shard moved to host
    assert level2.rollout == 0
    assert level1.processes == (NODE_SYSTEM_GIB + TRAINING_PROCESS_GIB + VLLM_ENGINE_PROCESS_GIB) * GIB


def test_headroom_is_kept_free_by_the_check():
    # the 8B case at a fixed share that fills the GPU to within the default headroom (9.05 GiB on an H200): 0.8 is
    # ~133 GiB since forward passes take forward_max_tokens rows (0.7, ~142 GiB, no longer fits even 2 GiB of headroom)
    tight = _case("roles.actor.offload_fraction=0.8", "cluster.host_memory_gib=1024")
    with pytest.raises(UserError, match=r"capacity - 9\.0 GiB cluster\.gpu_memory_headroom_gib"):
        plan_placement(tight)
    plan = plan_placement(_case("roles.actor.offload_fraction=0.8", "cluster.host_memory_gib=1024",
                                "cluster.gpu_memory_headroom_gib=2"))
    assert plan.memory[0].total > (141 - 9.05) * GIB and plan.over_capacity() == []


def test_auto_search_honours_the_headroom():
    cfg = load_experiment("ppo_llama3_8b", ["placement=auto"])
    plan = plan_placement(cfg)
    assert max(m.total for m in plan.memory.values()) <= plan.usable_bytes
    assert plan.headroom_bytes == pytest.approx((2 + 0.05 * cfg.cluster.gpu_memory_gib) * GIB, abs=1)
    # a headroom that leaves less than any role needs: the search finds nothing rather than overfilling
    with pytest.raises(UserError, match=r"^placement: no placement"):
        plan_placement(load_experiment("ppo_llama3_8b", ["placement=auto", "cluster.gpu_memory_headroom_gib=75"]))


def test_the_random_stand_in_is_rank_0_host_memory_and_a_real_checkpoint_is_not():
    # With no model.path, global rank 0 builds the whole random model (model.dtype) in host memory before anything
    # else (trainer/model_files.py): at PP 2 that is more than its stage's final export, which was all that
    # rank's checkpoint part counted (an 8B stand-in in fp32 peaked at 34.5 GiB RSS on the H100 against a
    # planned 23.9 GiB, benchmarks/results/lora8b_h100_20261206).
    from dataclasses import replace

    from hybridflow.placement.host_memory import random_init_bytes, rank_host_memory

    cfg = load_experiment("tiny_cpu", ["roles.actor.parallel.tp=1", "roles.actor.parallel.pp=2",
                                       "roles.rollout.parallel.tp=1", "trainer.save_last=false"])
    meshes = plan_placement(cfg).meshes
    whole = stage_params(cfg.model, "actor", 1, 1, 0) * 4  # fp32 (tiny_llama's dtype)
    assert whole > stage_params(cfg.model, "actor", 1, 2, 0) * 4
    assert random_init_bytes(cfg, meshes) == whole
    assert rank_host_memory(cfg, meshes, 0).checkpoint == whole
    assert rank_host_memory(cfg, meshes, 1).checkpoint < whole  # only rank 0 builds it
    with_path = replace(cfg, model=replace(cfg.model, path="/ckpt"))
    assert random_init_bytes(with_path, meshes) == 0
