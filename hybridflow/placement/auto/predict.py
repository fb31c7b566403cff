"""The auto search's cost model applied to a plan it did not choose (an explicit `placement.resources`).

Same workload, device figures, memory estimator and per-role stage times as the search, and the same
composition: roles sharing GPUs run one after another (their times add), disjoint sets run concurrently
(a stage lasts as long as its slowest set). The rollout is costed on the actor's GPUs at its own TP, as
the search models it; at trainer.rollout_lag=1 (native engine) as a role on its own GPUs. The stage times
are not added into an iteration here (at lag 1 generation overlaps the rest: overlap.py).
"""

from __future__ import annotations

from hybridflow.config.experiment import ExperimentConfig
from hybridflow.placement.auto.cost_model import role_stage_times
from hybridflow.placement.auto.device import DeviceSpec, efficiency_for
from hybridflow.placement.auto.from_config import memory_from_config, workload_from_config
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.placement.auto.workload import STAGES
from hybridflow.placement.planner import Plan


def predict_stage_times(cfg: ExperimentConfig, plan: Plan) -> dict[str, float]:
    """Predicted seconds per RL stage (generation, preparation, training) of one step of `plan`."""
    workload = workload_from_config(cfg)
    device = DeviceSpec.from_cluster(cfg.cluster)
    eff = efficiency_for(cfg.cluster.gpu_type)
    memory = memory_from_config(cfg)
    rollout = plan.meshes.get("rollout")
    stage = dict.fromkeys(STAGES, 0.0)
    for roles in plan.colocation_sets:
        set_times = dict.fromkeys(STAGES, 0.0)
        for name in roles:
            if name not in workload.role_names or name not in plan.meshes:
                continue  # a rollout riding on the actor: costed with it (its generation stage)
            mesh = plan.meshes[name]
            role = workload.role(name)
            s = Strategy(mesh.tp, mesh.pp, mesh.dp, rollout.tp if role.generates and rollout else 0)
            estimate = memory(name, s)
            kv = estimate[1] if estimate else 0.0  # None: a layout the search would skip; no KV figure then
            for key, seconds in role_stage_times(role, s, workload, device, eff, kv).items():
                set_times[key] += seconds
        stage = {key: max(stage[key], set_times[key]) for key in STAGES}
    return stage
