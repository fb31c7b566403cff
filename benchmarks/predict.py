"""The auto planner's cost model applied to a given plan, or searched over clusters we cannot run.

The cost model predicts three stages (generation, preparation, training); the measured trainer stages map
onto them as `MEASURED_TO_PREDICTED` says, so predicted and measured figures can sit side by side.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.flops import actor_update_flops, mfu
from hybridflow.config import ExperimentConfig
from hybridflow.config.cluster import resolve_cluster
from hybridflow.placement import Plan
from hybridflow.placement.auto import DeviceSpec, Strategy, efficiency_for, memory_from_config, workload_from_config
from hybridflow.placement.auto.cost_model import role_stage_times
from hybridflow.placement.auto.search import Candidate
from hybridflow.placement.auto.workload import GENERATION, PREPARATION, STAGES, TRAINING

MEASURED_TO_PREDICTED = {
    # the cost model charges the weight hand-off (bridge) to generation; wait_rollout is the generation a
    # one-step-off rollout (trainer.rollout_lag=1) did not hide behind training
    GENERATION: ("generate", "wait_rollout", "sync"),
    PREPARATION: ("reward", "ref", "values", "old_logprobs", "exchange"),
    TRAINING: ("advantages", "update_critic", "update_actor"),
}


def group_measured(stage_s: dict[str, float]) -> dict[str, float]:
    """Measured trainer stages summed into the cost model's three stages."""
    return {group: sum(stage_s.get(s, 0.0) for s in parts) for group, parts in MEASURED_TO_PREDICTED.items()}


def _figures(cfg: ExperimentConfig, stage_s: dict[str, float], actor_train_s: float, actor_gpus: int,
             world: int, seq_length: int | None = None) -> dict:
    """Throughput and actor-update MFU of a predicted iteration of `seq_length` tokens per sample (default:
    the config's, every prompt and response at full length)."""
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    seq_length = seq_length or cfg.data.seq_length
    tokens = samples * seq_length
    total = sum(stage_s.values())
    flops = actor_update_flops(cfg.model, tokens, seq_length, cfg.algorithm.ppo_epochs)
    peak = resolve_cluster(cfg.cluster).bf16_tflops
    return {"step_time_s": total, "stage_time_s": stage_s, "tokens_per_step": tokens,
            "throughput_tokens_per_s": tokens / total, "throughput_tokens_per_s_per_gpu": tokens / total / world,
            "actor_update_s": actor_train_s, "actor_update_mfu": mfu(flops, actor_train_s, actor_gpus, peak)}


def predict_plan(cfg: ExperimentConfig, plan: Plan, lengths: tuple[float, float] | None = None) -> dict:
    """Cost-model figures of `plan`'s exact layouts: roles of a colocation set run one after another (their
    times add), sets run in parallel (the slowest one counts), per stage.

    `lengths` = (prompt, response) tokens per sample, e.g. a run's measured means; default: the config's
    longest prompt and full response length."""
    workload = workload_from_config(cfg)
    if lengths is not None:
        prompt, response = (max(1, round(n)) for n in lengths)
        workload = replace(workload, prompt_length=prompt, response_length=response)
    device = DeviceSpec.from_cluster(cfg.cluster)
    eff = efficiency_for(cfg.cluster.gpu_type)
    memory = memory_from_config(cfg)
    role_times: dict[str, dict[str, float]] = {}
    for role in workload.roles:
        mesh = plan.meshes[role.name]
        gen_tp = plan.meshes["rollout"].tp if role.generates and "rollout" in plan.meshes else 0
        strategy = Strategy(mesh.tp, mesh.pp, mesh.dp, gen_tp)
        estimate = memory(role.name, strategy)
        role_times[role.name] = role_stage_times(role, strategy, workload, device, eff,
                                                 estimate[1] if estimate else 0.0)
    sets = [tuple(r for r in s if r in role_times) for s in plan.colocation_sets]
    placed = {r for s in sets for r in s}
    sets += [(r,) for r in role_times if r not in placed]
    stage_s = {st: max(sum(role_times[r].get(st, 0.0) for r in s) for s in sets if s) for st in STAGES}
    actor_train = role_times["actor"].get(TRAINING, 0.0)
    out = _figures(cfg, stage_s, actor_train, len(plan.meshes["actor"].ranks), plan.world_size,
                   workload.sequence_length)
    out["lengths"] = {"prompt": workload.prompt_length, "response": workload.response_length}
    return out


def predict_candidate(cfg: ExperimentConfig, cand: Candidate, world: int) -> dict:
    """Cost-model figures of one searched candidate (a colocation partition with its GPU counts)."""
    actor_set = next(s for s in cand.sets if "actor" in s.roles)
    actor = next(c for c in actor_set.choices if c.role == "actor")
    out = _figures(cfg, dict(cand.stage_times), actor.stage_times.get(TRAINING, 0.0), actor_set.gpus, world)
    out["strategies"] = {c.role: c.strategy.label() + f" on {s.gpus} GPUs" for s in cand.sets for c in s.choices}
    return out
