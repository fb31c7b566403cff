"""Iteration time of a one-step-off plan (trainer.rollout_lag=1): generation overlaps the other stages.

At lag 0 the stages run one after another (`Candidate.total` = generation + preparation + training). At
lag 1 the rollout holds GPUs of its own and step k of `hybridflow/trainer/rl_trainer.py` runs:

  1. the rollout ranks generate batch k+1 (with weights one update old)                  -> generate_s
  2. the training group (every rank holding actor, critic, ref or reward) consumes batch k: preparation,
     one exchange over the group, then training. A set that holds the rollout besides such a role joins
     that exchange only after generating, so its generation counts in front of its preparation  -> consume_s
  3. batch k+1 lands on every rank and is scored: a reward model's forward runs here, after 2  -> score_s
  4. the actor's new weights go to the rollout ranks (the split reshard plan)                 -> sync_s

  iteration = max(generate_s, consume_s) + score_s + sync_s

where consume_s = max over training sets (generation in front + preparation, reward excluded)
                  + max over training sets (training).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hybridflow.placement.auto.comm import split_sync_time
from hybridflow.placement.auto.device import DeviceSpec, Efficiency
from hybridflow.placement.auto.set_solver import RoleChoice, SetSolution
from hybridflow.placement.auto.workload import GENERATION, PREPARATION, TRAINING, Workload
from hybridflow.role_records import Role


@dataclass(frozen=True)
class OneStepOff:
    """The four terms of a one-step-off iteration (seconds)."""

    generate_s: float
    consume_s: float
    score_s: float
    sync_s: float

    @property
    def total(self) -> float:
        return max(self.generate_s, self.consume_s) + self.score_s + self.sync_s

    @property
    def hidden_s(self) -> float:
        """Generation time the consume hides (all of it when the consume is the longer)."""
        return min(self.generate_s, self.consume_s)


def _stage(choices: tuple[RoleChoice, ...], stage: str, skip: str = "") -> float:
    """Seconds of one set in `stage`: its roles (except `skip`) run one after another."""
    return sum(c.stage_times.get(stage, 0.0) for c in choices if c.role != skip)


def _choice(sets: tuple[SetSolution, ...], role: str) -> tuple[int, RoleChoice]:
    for i, s in enumerate(sets):
        for c in s.choices:
            if c.role == role:
                return i, c
    raise KeyError(role)


def sync_time(sets: tuple[SetSolution, ...], ranks: tuple[Sequence[int], ...], workload: Workload, device: DeviceSpec,
              eff: Efficiency) -> float:
    """The actor -> rollout weight sync of a plan whose rollout is on its own GPUs."""
    a, actor = _choice(sets, Role.ACTOR)
    r, rollout = _choice(sets, Role.ROLLOUT)
    nodes = {g // device.gpus_per_node for g in (*ranks[a], *ranks[r])}
    t, g = actor.strategy, rollout.strategy
    return split_sync_time(workload.role(Role.ROLLOUT).synced_bytes, t.tp, t.pp, t.dp, g.gen_tp, g.gen_dp,
                           len(nodes) == 1, device, eff)


def one_step_off(sets: tuple[SetSolution, ...], ranks: tuple[Sequence[int], ...], workload: Workload,
                 device: DeviceSpec, eff: Efficiency) -> OneStepOff:
    """The terms of the module docstring's formula for one candidate placement."""
    training = [s for s in sets if set(s.roles) - {Role.ROLLOUT}]
    generate = max(s.stage_time(GENERATION) for s in sets)
    # The reward role scores batch k+1 in step 3 (trainer.scorer.Scorer), not inside the consume of step 2.
    prepare = max(s.stage_time(GENERATION) + _stage(s.choices, PREPARATION, skip=Role.REWARD) for s in training)
    train = max(s.stage_time(TRAINING) for s in training)
    score = max(sum(c.stage_times.get(PREPARATION, 0.0) for c in s.choices if c.role == Role.REWARD) for s in sets)
    return OneStepOff(generate, prepare + train, score, sync_time(sets, ranks, workload, device, eff))
