"""`roles.<role>.lora`: off by default (full fine-tuning), on with a rank, checked with one line naming the field;
with actor adapters the reference is the actor's model with them off (`reference_is_actor_base`), so its
layout and GPUs are the actor's."""

from __future__ import annotations

import pytest

from hybridflow.config import load_experiment
from hybridflow.config.parallel import LORA_TARGET_MODULES, reference_is_actor_base
from hybridflow.errors import UserError
from hybridflow.placement.config_plan import plan_placement


def test_lora_is_off_by_default():
    cfg = load_experiment("tiny_cpu")
    for role in ("actor", "critic", "ref", "reward"):
        assert not cfg.roles.get(role).lora.enabled
    assert not reference_is_actor_base(cfg.roles)


def test_rank_alone_turns_adapters_on():
    cfg = load_experiment("tiny_cpu", ["roles.actor.lora.rank=8", "roles.actor.lora.alpha=16",
                                       "roles.critic.lora.rank=4", "roles.critic.lora.target_modules=[qkv,fc2]"])
    actor, critic = cfg.roles.actor.lora, cfg.roles.critic.lora
    assert actor.enabled and actor.rank == 8 and actor.alpha == 16 and actor.target_modules == list(LORA_TARGET_MODULES)
    assert critic.enabled and critic.target_modules == ["qkv", "fc2"]
    assert reference_is_actor_base(cfg.roles)
    assert not reference_is_actor_base(load_experiment("tiny_cpu", ["roles.critic.lora.rank=4"]).roles)
    assert not reference_is_actor_base(
        load_experiment("tiny_cpu", ["roles.actor.lora.rank=4", "roles.ref.enabled=false"]).roles)


def test_config_names_are_megatron_adapters_targets():
    from megatron_adapters.lora import LORA_TARGETS

    assert tuple(f"linear_{t}" for t in LORA_TARGET_MODULES) == LORA_TARGETS


@pytest.mark.parametrize("overrides, match", [
    (["roles.actor.lora.rank=0"], r"^roles\.actor\.lora\.rank: 0 is below 1"),
    (["roles.actor.lora.rank=4", "roles.actor.lora.alpha=0"], r"^roles\.actor\.lora\.alpha: 0\.0 "),
    (["roles.actor.lora.rank=4", "roles.actor.lora.dropout=1.0"], r"^roles\.actor\.lora\.dropout: 1\.0 "),
    (["roles.actor.lora.rank=4", "roles.actor.lora.target_modules=[qkv,q_proj]"],
     r"^roles\.actor\.lora\.target_modules: 'q_proj' is unknown; use one of qkv, proj, fc1, fc2$"),
    (["roles.critic.lora.rank=4", "roles.critic.lora.target_modules=[]"],
     r"^roles\.critic\.lora\.target_modules: \[\] adapts nothing"),
    (["roles.ref.lora.rank=4"], r"^roles\.ref\.lora\.rank: 4 on an untrained role; .*set roles\.ref\.lora\.rank=null$"),
    (["roles.actor.lora.rank=4", "roles.ref.parallel.tp=1"],
     r"^roles\.ref\.parallel\.tp: 1 differs from roles\.actor\.parallel\.tp=2; .*set roles\.ref\.parallel\.tp=2"),
])
def test_bad_lora_names_the_field(overrides, match):
    with pytest.raises(UserError, match=match) as err:
        load_experiment("tiny_cpu", overrides)
    assert "\n" not in str(err.value) and ";" in str(err.value)


def test_reference_on_other_gpus_is_refused():
    # the full fine-tuning run may place the reference apart; with actor adapters it has no model of its own
    moved = ["placement.resources.ref=[2,3]", "roles.ref.parallel.tp=2"]
    assert plan_placement(load_experiment("tiny_cpu", moved)).meshes["ref"].ranks == (2, 3)
    with pytest.raises(UserError, match=r"^placement\.resources\.ref: the reference runs on GPUs \[2, 3\]"):
        plan_placement(load_experiment("tiny_cpu", [*moved, "roles.actor.lora.rank=4"]))


def test_sync_is_the_engines_default_unless_set(monkeypatch):
    from types import SimpleNamespace

    import hybridflow.config.experiment as experiment
    from hybridflow.config.experiment import syncs_adapters, with_engine

    cfg = load_experiment("tiny_cpu", ["roles.actor.lora.rank=4"])
    assert cfg.roles.actor.lora.sync is None
    assert syncs_adapters(cfg)  # the native engine is built with the actor's adapter spec
    assert not syncs_adapters(with_engine(cfg, "vllm"))  # vLLM: merged unless asked (its LoRA path is unmeasured)
    explicit = load_experiment("tiny_cpu", ["roles.actor.lora.rank=4", "roles.actor.lora.sync=adapters"])
    assert syncs_adapters(with_engine(explicit, "vllm"))
    asleep = with_engine(load_experiment("tiny_cpu", ["roles.actor.lora.rank=4", "roles.actor.lora.sync=adapters",
                                                      "rollout.sleep_level=2"]), "vllm")
    with pytest.raises(UserError, match=r"^roles\.actor\.lora\.sync: adapters ships the base weights once, but "
                                        r"rollout\.sleep_level=2 discards them .*set rollout\.sleep_level=1"):
        syncs_adapters(asleep)  # vLLM at level 2 drops its weights when it sleeps: the base would be gone
    assert not syncs_adapters(load_experiment("tiny_cpu", ["roles.actor.lora.rank=4", "roles.actor.lora.sync=merged"]))
    assert not syncs_adapters(load_experiment("tiny_cpu"))  # no adapters, nothing to choose
    merged_only = SimpleNamespace(traits=SimpleNamespace(adapter_sync=("merged",)))
    monkeypatch.setattr(experiment, "engine_of", lambda cfg: merged_only)
    with pytest.raises(UserError, match=r"^roles\.actor\.lora\.sync: adapters, but rollout\.engine=megatron takes "
                                        r"merged; set roles\.actor\.lora\.sync=merged$"):
        syncs_adapters(explicit)


@pytest.mark.parametrize("overrides, match", [
    (["roles.critic.lora.rank=4", "roles.critic.lora.sync=adapters"],
     r"^roles\.critic\.lora\.sync: adapters; only the actor's weights go to the rollout"),
    (["roles.actor.lora.rank=4", "roles.actor.lora.sync=lora"], r"^roles\.actor\.lora\.sync: 'lora' is unknown"),
])
def test_bad_sync_names_the_field(overrides, match):
    with pytest.raises(UserError, match=match):
        load_experiment("tiny_cpu", overrides)
