"""The over-capacity refusal lists only fixes that would help: none the command already applied."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.errors import UserError
from hybridflow.placement import plan_placement

GRPO_8B_ONE_H100 = ["model=llama3_8b", "algorithm=grpo", "rollout.n_samples_per_prompt=4",
                    "roles.critic.enabled=false", "cluster.gpu_type=H100"]


def _refusal(experiment: str, overrides: list[str]) -> str:
    with pytest.raises(UserError, match=r"^cluster\.gpu_memory_gib: GPU 0 .* needs an estimated") as err:
        plan_placement(load_experiment(experiment, overrides))
    return str(err.value)


def test_applied_offload_is_not_suggested_again():
    text = _refusal("ppo_llama_1b_h200", [*GRPO_8B_ONE_H100, "roles.actor.offload_optimizer=true"])
    assert "offload_optimizer" not in text and "offload_fraction" not in text
    assert "roles.<role>" not in text  # every fix names its role
    assert "lower roles.actor.micro_batch_size (now 4)" in text
    assert "use more GPUs" in text  # tp/pp cannot rise on the one GPU there is
    # the native engine sizes its cache for the batch: its utilization share would not help
    assert "gpu_memory_utilization" not in text and "lower data.train_batch_size" in text


def test_roles_without_offload_are_named():
    text = _refusal("ppo_llama3_8b_4gpu",
                    ["roles.actor.offload_optimizer=false", "roles.critic.offload_optimizer=false"])
    assert "set roles.actor.offload_optimizer=true" in text and "set roles.critic.offload_optimizer=true" in text
    assert "lower rollout.gpu_memory_utilization (now" in text  # vLLM fills that share of the GPU


def test_a_partial_offload_share_is_named_with_its_value():
    text = _refusal("ppo_llama_1b_h200", [*GRPO_8B_ONE_H100, "roles.actor.offload_optimizer=true",
                                          "roles.actor.offload_fraction=0.5"])
    assert "raise roles.actor.offload_fraction (now 0.5) toward 1" in text
    assert "offload_optimizer" not in text


def test_offload_over_fp32_params_is_refused_and_not_suggested():
    # the rank's build_optimizer refuses it (megatron's HybridDeviceOptimizer takes bf16 params only)
    fp32 = ["model.dtype=fp32", "roles.actor.offload_optimizer=true", "roles.actor.offload_fraction=1.0"]
    with pytest.raises(UserError, match=r"^roles\.actor\.offload_optimizer: megatron offloads the optimizer of bf16 "
                                        r"params only and model\.dtype is fp32; set model\.dtype=bf16 or"):
        plan_placement(load_experiment("ppo_llama_1b_h200", [*GRPO_8B_ONE_H100, *fp32]))
    plan_placement(load_experiment("tiny_cpu", ["roles.actor.offload_optimizer=true"]))  # CPU: offload is moot
    text = _refusal("ppo_llama_1b_h200", [*GRPO_8B_ONE_H100, "model.dtype=fp32"])
    assert "offload_optimizer" not in text and "lower roles.actor.micro_batch_size" in text
