"""The auto planner's cost model applied to a given plan, or searched over clusters we cannot run.

The cost model predicts three stages (generation, preparation, training); the measured trainer stages map
onto them as `MEASURED_TO_PREDICTED` says, so predicted and measured figures can sit side by side.
"""

from __future__ import annotations

from benchmarks.flops import actor_update_flops, mfu
from hybridflow.config import ExperimentConfig
from hybridflow.config.cluster import resolve_cluster
from hybridflow.placement import Plan
from hybridflow.placement.auto.from_config import plan_candidate, workload_at_lengths
from hybridflow.placement.auto.search import Candidate
from hybridflow.placement.auto.workload import GENERATION, PREPARATION, TRAINING

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


def _figures(cfg: ExperimentConfig, cand: Candidate, world: int, seq_length: int | None = None) -> dict:
    """Throughput and actor-update MFU of a predicted iteration (`cand.total`, overlap included at
    rollout_lag=1) of `seq_length` tokens per sample (default: the config's, every sample at full length)."""
    actor = next(c for s in cand.sets for c in s.choices if c.role == "actor")
    actor_train_s = actor.stage_times.get(TRAINING, 0.0)
    actor_gpus = actor.strategy.tp * actor.strategy.pp * actor.strategy.dp
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    seq_length = seq_length or cfg.data.seq_length
    tokens = samples * seq_length
    total = cand.total
    flops = actor_update_flops(cfg.model, tokens, seq_length, cfg.algorithm.ppo_epochs)
    peak = resolve_cluster(cfg.cluster).bf16_tflops
    return {"step_time_s": total, "stage_time_s": dict(cand.stage_times), "tokens_per_step": tokens,
            "throughput_tokens_per_s": tokens / total, "throughput_tokens_per_s_per_gpu": tokens / total / world,
            "actor_update_s": actor_train_s,
            "actor_update_mfu": mfu(flops, actor_train_s, actor_gpus, peak)}


def predict_plan(cfg: ExperimentConfig, plan: Plan, lengths: tuple[float, float] | None = None) -> dict:
    """Cost-model figures of `plan`'s exact layouts, composed as the search composes its own candidates
    (`hybridflow.placement.auto.from_config.plan_candidate`).

    `lengths` = (prompt, response) tokens per sample, e.g. a run's measured means; default: the config's
    longest prompt and full response length."""
    workload = workload_at_lengths(cfg, lengths)
    out = _figures(cfg, plan_candidate(cfg, plan, lengths), plan.world_size, workload.sequence_length)
    out["lengths"] = {"prompt": workload.prompt_length, "response": workload.response_length}
    return out


def predict_candidate(cfg: ExperimentConfig, cand: Candidate, world: int) -> dict:
    """Cost-model figures of one searched candidate (a colocation partition with its GPU counts)."""
    out = _figures(cfg, cand, world)
    out["strategies"] = {c.role: c.strategy.label() + f" on {s.gpus} GPUs" for s in cand.sets for c in s.choices}
    return out
