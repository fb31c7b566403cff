"""build_run's order and hand-offs, with every collective and model build replaced by a recorder:
- the rollout engine's early start (an engine process's imports) comes before any model is built, and what it
  returned reaches the engine's build;
- each trained role is built with the update micro-batch the plan's token budget gives (plan.json's
  update_max_tokens), not the config's own value."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

import hybridflow.trainer.build as build
from hybridflow.config import load_experiment
from hybridflow.placement import plan_placement


class Built(Exception):
    """Stops build_run once the rollout role is asked for: nothing after it is under test here."""


def test_engine_starts_before_the_models_and_roles_get_the_plans_update_budget(tmp_path, monkeypatch):
    cfg = load_experiment("tiny_cpu", [f"trainer.output_dir={tmp_path}"])
    plan = plan_placement(cfg)
    seq = cfg.data.seq_length
    # budgets unlike the config's own (unset there): 12 rows for the actor, 5 whole rows for the critic
    plan = dataclasses.replace(plan, update_max_tokens={"actor": 12 * seq, "critic": 5 * seq + 3})
    events: list[tuple] = []
    token = object()

    def start_rollout(engine, setup):
        events.append(("start", engine, setup.mesh.role))
        return token

    def build_model_role(name, *args, **kwargs):
        events.append(("model", name, kwargs["update_micro_batch_size"]))
        return SimpleNamespace(name=name)

    def build_rollout_role(engine, setup, reshard_plan, sampling, started, turns=None, adapter_dir=None):
        events.append(("rollout", engine, started is token))
        raise Built

    monkeypatch.setattr(build, "ensure_model_files", lambda cfg, work_dir: ("hf", "tok"))
    monkeypatch.setattr(build, "role_model_dirs", lambda cfg, work_dir, hf_dir: dict.fromkeys(plan.meshes, "hf"))
    monkeypatch.setattr(build, "load_tokenizer", lambda path: SimpleNamespace(pad_token_id=0))
    monkeypatch.setattr(build, "stop_token_ids", lambda cfg, tokenizer: (1,))
    monkeypatch.setattr(build, "build_reshard_plan", lambda actor, rollout: None)
    monkeypatch.setattr(build, "build_groups", lambda meshes: {role: object() for role in meshes})
    monkeypatch.setattr(build, "build_training_group", lambda meshes: None)
    monkeypatch.setattr(build, "start_rollout", start_rollout)
    monkeypatch.setattr(build, "build_model_role", build_model_role)
    monkeypatch.setattr(build, "build_rollout_role", build_rollout_role)
    with pytest.raises(Built):
        build.build_run(cfg, plan, tmp_path)
    assert events[0] == ("start", plan.rollout_engine, "rollout")
    assert [e[1] for e in events[1:-1]] == ["actor", "critic", "ref"]
    assert events[-1] == ("rollout", plan.rollout_engine, True)
    update_rows = {e[1]: e[2] for e in events if e[0] == "model"}
    assert update_rows["actor"] == 12 and update_rows["critic"] == 5  # budget // seq_length, whole rows
