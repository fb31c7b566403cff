"""The role registry (hybridflow/role_records.py): one record per role, and no role name spelled elsewhere."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from hybridflow.config import ExperimentConfig, RolesConfig
from hybridflow.errors import UserError
from hybridflow.registry import Registry
from hybridflow.role_records import (
    ROLE_RECORDS,
    Role,
    RoleRecord,
    Stage,
    model_roles,
    own_model_fields,
    register_role,
    role_names,
    role_record,
    trained_roles,
)

PACKAGE = Path(__file__).resolve().parents[1] / "hybridflow"
REGISTRY_MODULE = PACKAGE / "role_records.py"
# Strings that equal a role's name but are not one: (file under hybridflow/, string) -> what it is.
NOT_A_ROLE = {
    ("trainer/samples.py", "reward"): "a sample record's score field in samples.jsonl",
    ("launch/command_help.py", "rollout"): "the conf/rollout config group",
}


def role_literals(source: str) -> list[tuple[int, str]]:
    """(line, string) of every string constant in `source` that equals a role's name, except a stage timer's
    name (`timer("ref")`: a metric key, time/ref) and docstrings (only whole constants are seen)."""
    tree = ast.parse(source)
    timer_names = {id(node.args[0]) for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "timer"
                   and node.args}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in set(Role) and id(node) not in timer_names]


def test_the_scan_sees_a_role_literal_and_skips_a_timer_name():
    assert role_literals('x = {"critic": 1}\nif r == "ref":\n    pass\nwith timer("ref"):\n    pass\n') == [
        (1, "critic"), (2, "ref")]


def test_no_role_name_is_spelled_outside_the_registry():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == REGISTRY_MODULE:
            continue
        rel = path.relative_to(PACKAGE).as_posix()
        found += [f"hybridflow/{rel}:{line}: {value!r}" for line, value in role_literals(path.read_text())
                  if (rel, value) not in NOT_A_ROLE]
    assert found == [], "use hybridflow.role_records (Role members, role_record(...)) instead:\n" + "\n".join(found)


def test_every_allowed_exception_is_still_there():
    for rel, value in NOT_A_ROLE:
        assert value in [v for _, v in role_literals((PACKAGE / rel).read_text())], (rel, value)


def test_records_agree_with_the_config_schema():
    assert role_names() == tuple(Role) == tuple(f.name for f in dataclasses.fields(RolesConfig))
    experiment_fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    assert set(own_model_fields()) <= experiment_fields and own_model_fields() == ("critic_model", "reward_model")
    for record in ROLE_RECORDS.records():
        assert record.weights_from is None or record.weights_from in ROLE_RECORDS
        assert record.stages and set(record.stages) <= set(Stage)
        assert not record.trained or (record.holds_model and Stage.TRAINING in record.stages)


def test_heads_are_the_ones_megatron_builds():
    from megatron_adapters.model import HEADS

    assert {role_record(r).head for r in model_roles()} == set(HEADS)


def test_the_derived_role_sets():
    assert model_roles() == (Role.ACTOR, Role.CRITIC, Role.REF, Role.REWARD)
    assert trained_roles() == (Role.ACTOR, Role.CRITIC)
    assert [r for r in role_names() if role_record(r).scalar_head] == [Role.CRITIC, Role.REWARD]
    assert role_record(Role.REF).weights_from == role_record(Role.ROLLOUT).weights_from == Role.ACTOR


def test_lookup_of_an_unknown_role_names_the_known_ones():
    assert role_record("critic") is role_record(Role.CRITIC)
    with pytest.raises(UserError) as err:
        role_record("judge")
    assert str(err.value) == "role: 'judge' is unknown; use one of actor, critic, ref, reward, rollout"


def test_a_role_is_registered_once(monkeypatch):
    monkeypatch.setattr("hybridflow.role_records.ROLE_RECORDS", Registry("role", "role"))
    actor = ROLE_RECORDS.get(Role.ACTOR)  # the real record, filed again in an empty registry
    register_role(actor)
    assert register_role(actor) is actor  # the same record again: a no-op
    with pytest.raises(ValueError, match="registered already"):
        register_role(RoleRecord(Role.ACTOR, holds_model=True, trained=False, head="lm", stages=(Stage.PREPARATION,)))
