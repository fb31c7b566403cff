"""One benchmark run's figures from the trainer's metrics.jsonl: warm-up steps dropped, the rest averaged."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.flops import actor_update_flops, mfu
from hybridflow.config import ExperimentConfig
from hybridflow.config.cluster import resolve_cluster
from hybridflow.placement import Plan

# The trainer's stage timers, in dataflow order (time/<stage> in metrics.jsonl).
# wait_rollout: at trainer.rollout_lag=1, the generation the training ranks waited for after their update.
STAGES = ("generate", "wait_rollout", "reward", "ref", "values", "old_logprobs", "exchange", "advantages",
          "update_critic", "update_actor", "sync")


def read_rl_records(path: Path) -> list[dict]:
    """The rl-phase records of metrics.jsonl in step order (the last record of a step wins)."""
    by_step: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            record = json.loads(line)
            if record.get("phase") == "rl":
                by_step[record["step"]] = record
    return [by_step[s] for s in sorted(by_step)]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(records: list[dict], warmup_steps: int, cfg: ExperimentConfig, plan: Plan) -> dict:
    """Throughput, stage times, actor-update MFU, peak memory and parity over the timed steps.

    Throughput is (prompt + response tokens) / step time summed over the timed steps, HybridFlow's metric;
    a step's tokens are recovered as tokens_per_s * step_time_s of its record.
    """
    timed = records[warmup_steps:]
    if not timed:
        raise ValueError(f"metrics: {len(records)} rl steps recorded, none left after {warmup_steps} warm-up steps")
    tokens = [r["tokens_per_s"] * r["step_time_s"] for r in timed]
    step_s = [r["step_time_s"] for r in timed]
    samples = cfg.data.train_batch_size * cfg.rollout.n_samples_per_prompt
    stages = {s: _mean([r.get(f"time/{s}", 0.0) for r in timed]) for s in STAGES}
    extra = sorted({k.removeprefix("time/") for r in timed for k in r if k.startswith("time/")} - set(STAGES))
    stages |= {s: _mean([r.get(f"time/{s}", 0.0) for r in timed]) for s in extra}
    actor_gpus = len(plan.meshes["actor"].ranks)
    peak = resolve_cluster(cfg.cluster).bf16_tflops
    flops = actor_update_flops(cfg.model, _mean(tokens), _mean(tokens) / samples, cfg.algorithm.ppo_epochs)
    memory = [r["peak_memory_gib"] for r in timed if "peak_memory_gib" in r]
    throughput = sum(tokens) / sum(step_s)
    update_s = stages["update_actor"]
    return {
        "timed_steps": len(timed),
        "tokens_per_step": _mean(tokens),
        "step_time_s": _mean(step_s),
        "throughput_tokens_per_s": throughput,
        "throughput_tokens_per_s_per_gpu": throughput / plan.world_size,
        "stage_time_s": stages,
        "actor_update": {"flops": flops, "gpus": actor_gpus, "peak_tflops_per_gpu": peak,
                         "seconds": update_s, "mfu": mfu(flops, update_s, actor_gpus, peak)},
        "peak_memory_gib": max(memory) if memory else None,
        # None at rollout_lag=1: the samples come from the weights before the update, so there is no parity to
        # measure; offpolicy_* is the rollout-vs-actor gap then (the one-update drift).
        "parity_max_abs": max((r["parity/max_abs"] for r in timed if "parity/max_abs" in r), default=None),
        "parity_mean_abs": _mean([r["parity/mean_abs"] for r in timed if "parity/mean_abs" in r]),
        "offpolicy_max_abs": max((r["offpolicy/max_abs"] for r in timed if "offpolicy/max_abs" in r), default=None),
        # the rollout engine's own generation time (on a split placement, concurrent with training at lag 1)
        "rollout_generate_s": _mean([r.get("rollout/generate_s", 0.0) for r in timed]),
        "reward_mean": _mean([r.get("reward/mean", 0.0) for r in timed]),
        # mean tokens per sample, so the cost model can be asked about the lengths the run really had
        "prompt_length": _mean([r["prompt_length"] for r in timed]) if all("prompt_length" in r for r in timed)
        else None,
        "response_length": _mean([r.get("response_length", 0.0) for r in timed]),
    }
