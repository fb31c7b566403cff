"""The auto search's cost model applied to a plan it did not choose (an explicit `placement.resources`).

Same workload, device figures, memory estimator and per-role stage times as the search, and the same
composition (`search.compose`): roles sharing GPUs run one after another (their times add), disjoint sets
run concurrently (a stage lasts as long as its slowest set), and at trainer.rollout_lag=1 (native engine)
generation on the rollout's own GPUs overlaps the rest. At lag 0 the rollout is costed on the actor's GPUs
at its own TP, as the search models it.
"""

from __future__ import annotations

from dataclasses import replace

from hybridflow.config.experiment import ExperimentConfig
from hybridflow.placement.auto.cost_model import role_stage_breakdown
from hybridflow.placement.auto.device import DeviceSpec, Efficiency, efficiency_for
from hybridflow.placement.auto.from_config import memory_from_config, workload_from_config
from hybridflow.placement.auto.search import Candidate, compose
from hybridflow.placement.auto.set_solver import RoleChoice, SetSolution
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import Workload
from hybridflow.placement.planner import Plan


def workload_at_lengths(cfg: ExperimentConfig, lengths: tuple[float, float] | None = None) -> Workload:
    """The config's workload, at (prompt, response) tokens per sample when given (rounded, at least 1)."""
    workload = workload_from_config(cfg)
    if lengths is None:
        return workload
    prompt, response = (max(1, round(n)) for n in lengths)
    return replace(workload, prompt_length=prompt, response_length=response)


def plan_candidate(cfg: ExperimentConfig, plan: Plan, lengths: tuple[float, float] | None = None,
                   eff: Efficiency | None = None) -> Candidate:
    """`plan` priced as the search prices its own candidates; `candidate.total` is the predicted step.

    `lengths` = (prompt, response) tokens per sample, e.g. a run's measured means; default: the config's
    longest prompt and full response length. `eff`: the cost-model factors (default: those measured on
    `cfg.cluster.gpu_type`, as the search uses).
    """
    workload = workload_at_lengths(cfg, lengths)
    # the optimizer shares the plan offloads (an unset roles.<role>.offload_fraction is the plan's pick)
    workload = replace(workload, roles=tuple(
        replace(r, offload_fraction=plan.offload_fractions.get(r.name, 0.0)) if r.trains else r
        for r in workload.roles))
    device = DeviceSpec.from_cluster(cfg.cluster)
    eff = eff or efficiency_for(cfg.cluster.gpu_type)
    memory = memory_from_config(cfg)
    rollout = plan.meshes.get("rollout")
    sets, ranks = [], []
    for roles in plan.colocation_sets:
        choices = []
        for name in roles:
            if name not in workload.role_names:
                continue  # a rollout riding on the actor: costed with it (its generation stage)
            mesh, role = plan.meshes[name], workload.role(name)
            s = Strategy(mesh.tp, mesh.pp, mesh.dp, rollout.tp if role.generates and rollout else 0)
            estimate = memory(name, s)  # None: a layout the search would skip; no figures then
            bytes_, kv = estimate if estimate else (0.0, 0.0)
            parts = role_stage_breakdown(role, s, workload, device, eff, kv)
            times = {stage: sum(p.values()) for stage, p in parts.items()}
            choices.append(RoleChoice(name, s, bytes_, times, parts))  # with parts, as the search's choices
        if choices:
            held = sorted({r for name in roles for r in plan.meshes[name].ranks})
            sets.append(SetSolution(tuple(c.role for c in choices), len(held), tuple(choices)))
            ranks.append(tuple(held))
    return compose(tuple(sets), tuple(ranks), workload, device, eff)

