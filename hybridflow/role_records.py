"""The roles of a run, one record each: what a role is (trained or not, the head its model ends in, the stages
of the dataflow it joins, whose weights it starts from or shares). Config, the planner, the build and the
trainer ask the record; no other module spells a role's name.

A `Role` member equals its string, so config keys (`roles.critic`, `placement.resources.critic`), plan.json keys
and dicts keyed by role name stay plain strings on the wire. This module is a leaf (it imports only
hybridflow.registry), so config and placement may import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hybridflow.registry import Registry


class Role(StrEnum):
    """A role's name. A member equals its string, so config keys and dicts keyed by "actor" keep working."""

    ACTOR = "actor"
    CRITIC = "critic"
    REF = "ref"
    REWARD = "reward"
    ROLLOUT = "rollout"


class Stage(StrEnum):
    """The dataflow of one PPO iteration (HybridFlow section 2): generation, then preparation (the models score
    the responses: old and reference log-probs, values, rewards), then training of the trained roles."""

    GENERATION = "generation"
    PREPARATION = "preparation"
    TRAINING = "training"


@dataclass(frozen=True)
class RoleRecord:
    """What one role is. `head`: what its model ends in, "lm" (vocab logits), "value" or "reward" (one scalar
    per token); the rollout's engine generates, so "lm".

    `stages`: the stages whose work it does. The actor generates at trainer.rollout_lag=0 (the rollout engine
    runs on its GPUs, weights handed over in place); at lag 1 the planner moves generation to the rollout role
    (placement.auto.workload.split_rollout), hence the rollout's own (generation,).

    `weights_from`: the role whose weights this one starts from or shares (ref: the actor's checkpoint, and the
    actor's SFT warm-up result; rollout: the actor's live weights, through the bridge). Where a role's unset
    layout and micro-batch settings default to another's, that is this role too (ref).

    `own_model_field`: the experiment field that may name the role's own checkpoint (`critic_model`); unset
    there, or None here, the role runs `model`.
    """

    name: Role
    holds_model: bool  # a megatron model of its own on its ranks (the rollout holds an engine instead)
    trained: bool  # an optimizer, gradients and an update in the training stage
    head: str
    stages: tuple[Stage, ...]
    weights_from: Role | None = None
    own_model_field: str | None = None

    @property
    def scalar_head(self) -> bool:
        """Its model ends in one scalar per token (value or reward head), not the LM head."""
        return self.head != "lm"


ROLE_RECORDS: Registry[RoleRecord] = Registry("role", "role")


def register_role(record: RoleRecord) -> RoleRecord:
    """File `record` under its name; registration order is the canonical role order."""
    return ROLE_RECORDS.add(record.name, record)


def role_record(name: str) -> RoleRecord:
    """The record of role `name`; one UserError line listing the known roles otherwise."""
    return ROLE_RECORDS.get(name)


def role_names() -> tuple[Role, ...]:
    """Every role, in canonical order (actor, critic, ref, reward, rollout)."""
    return tuple(r.name for r in ROLE_RECORDS.records())


def model_roles() -> tuple[Role, ...]:
    """The roles that hold a megatron model, in canonical order."""
    return tuple(r.name for r in ROLE_RECORDS.records() if r.holds_model)


def trained_roles() -> tuple[Role, ...]:
    """The roles with an optimizer, in canonical order."""
    return tuple(r.name for r in ROLE_RECORDS.records() if r.trained)


def own_model_fields() -> tuple[str, ...]:
    """The experiment fields where roles may name their own checkpoint (critic_model, reward_model)."""
    return tuple(r.own_model_field for r in ROLE_RECORDS.records() if r.own_model_field is not None)


register_role(RoleRecord(Role.ACTOR, holds_model=True, trained=True, head="lm",
                         stages=(Stage.GENERATION, Stage.PREPARATION, Stage.TRAINING)))
register_role(RoleRecord(Role.CRITIC, holds_model=True, trained=True, head="value",
                         stages=(Stage.PREPARATION, Stage.TRAINING), own_model_field="critic_model"))
register_role(RoleRecord(Role.REF, holds_model=True, trained=False, head="lm", stages=(Stage.PREPARATION,),
                         weights_from=Role.ACTOR))
register_role(RoleRecord(Role.REWARD, holds_model=True, trained=False, head="reward", stages=(Stage.PREPARATION,),
                         own_model_field="reward_model"))
register_role(RoleRecord(Role.ROLLOUT, holds_model=False, trained=False, head="lm", stages=(Stage.GENERATION,),
                         weights_from=Role.ACTOR))
