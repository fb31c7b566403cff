"""Fit the cost model's fixed time per role pass and torch's CPU Adam rate to the measured H200 steps.

    python -m benchmarks.fit_pass_overhead

Every forward-only pass (ref, values, old log-probs) and update (update_actor, update_critic) of the measured
runs is one point: the measured stage mean less the model's prediction with both figures at 0 leaves

    residual = role_pass_overhead_s + cpu_adam_s_per_param * (offloaded parameters * optimizer steps)

(the second term only where the run offloads its optimizer), and each update measured with and without offload
one more point, the difference, which only CPU Adam (and the host-link copies already in the model) explains.
One least-squares fit over every point gives the two figures together (device.py PASS_OVERHEAD and CPU_ADAM
cite its output): the levels alone would fit CPU Adam to the 1B actor update the model prices too low.
Generation is left out: its decode terms are fitted to decode steps of their own (fit_decode.py, VLLM_DECODE).

Runs (benchmarks/results/): ppo_llama_1b_h200_20261203 (1B PPO colocated, 7.72 s),
ppo_llama_1b_h200_offload_20261202 (the same with both optimizers on the host), smollm2_h200_20261204
(grpo_smollm2, 1.97 s; stage means over steps 2-80 of its metrics.jsonl).
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from hybridflow.placement import plan_placement
from hybridflow.placement.auto.cost_model import role_stage_times
from hybridflow.placement.auto.device import DeviceSpec, efficiency_for
from hybridflow.placement.auto.from_config import memory_from_config, workload_at_lengths
from hybridflow.placement.auto.strategy import Strategy
from hybridflow.resolve import resolve_experiment

RESULTS = Path(__file__).resolve().parent / "results"
# measured stage name -> (role, cost-model stage)
PASSES = {"ref": ("ref", "preparation"), "values": ("critic", "preparation"),
          "old_logprobs": ("actor", "preparation"), "update_actor": ("actor", "training"),
          "update_critic": ("critic", "training")}
OFFLOAD = ["roles.actor.offload_optimizer=true", "roles.critic.offload_optimizer=true",
           "roles.actor.offload_fraction=1.0", "roles.critic.offload_fraction=1.0"]
# The runs predate the planner's update token budget: their updates ran micro_batch_size rows.
MEASURED_AT = ["roles.actor.update_max_tokens=0", "roles.critic.update_max_tokens=0"]


def _smollm2_stages() -> dict[str, float]:
    rows = [json.loads(line) for line in
            (RESULTS / "smollm2_h200_20261204/hybridflow-megatron_s1/metrics.jsonl").read_text().splitlines()]
    rl = [r for r in rows if r.get("phase") == "rl"][1:]  # step 1 warms up
    return {name: statistics.mean(r[f"time/{name}"] for r in rl) for name in ("ref", "old_logprobs", "update_actor")}


def runs() -> list[tuple[str, str, list[str], tuple[float, float] | None, dict[str, float]]]:
    """(label, experiment, overrides, (prompt, response) lengths or None = the config's, measured stages)."""
    def stages(path: str) -> dict[str, float]:
        return json.loads((RESULTS / path).read_text())["measured"]["stage_time_s"]

    return [("1b", "ppo_llama_1b_h200", ["placement=colocated"], (7, 1024),
             stages("ppo_llama_1b_h200_20261203/colocated.json")),
            ("1b_offload", "ppo_llama_1b_h200", ["placement=colocated", *OFFLOAD], (7, 1024),
             stages("ppo_llama_1b_h200_offload_20261202/colocated.json")),
            ("smollm2", "grpo_smollm2", [], None, _smollm2_stages())]


def points() -> list[tuple[str, str, float, float, float]]:
    """(run, pass, measured s, predicted s at both figures 0, offloaded parameters x optimizer steps)."""
    out = []
    for label, experiment, overrides, lengths, measured in runs():
        cfg = resolve_experiment(experiment, [*overrides, *MEASURED_AT])
        plan = plan_placement(cfg)
        workload = workload_at_lengths(cfg, lengths)
        device = DeviceSpec.from_cluster(cfg.cluster)
        eff = replace(efficiency_for(cfg.cluster.gpu_type), role_pass_overhead_s=0.0, cpu_adam_s_per_param=0.0)
        memory = memory_from_config(cfg)
        for name, (role_name, stage) in PASSES.items():
            if name not in measured or role_name not in workload.role_names:
                continue
            mesh = plan.meshes[role_name]
            role = replace(workload.role(role_name), offload_fraction=plan.offload_fractions.get(role_name, 0.0))
            s = Strategy(mesh.tp, mesh.pp, mesh.dp, plan.meshes["rollout"].tp if role.generates else 0)
            kv = (memory(role_name, s) or (0.0, 0.0))[1]
            base = role_stage_times(role, s, workload, device, eff, kv)[stage]
            steps = workload.samples * workload.ppo_epochs / workload.mini_batch_size
            on_host = role.model.params / (s.tp * s.pp * s.dp) * role.offload_fraction if stage == "training" else 0
            out.append((label, name, measured[name], base, on_host * steps))
    return out


def fit(pts: list[tuple[str, str, float, float, float]]) -> tuple[float, float]:
    """(role_pass_overhead_s, cpu_adam_s_per_param) by least squares over the residuals of every pass and of
    every offloaded update less the same update without offload."""
    rows = [(1.0, x, m - base) for _, _, m, base, x in pts]
    by_pass = {(label, name): (m, base, x) for label, name, m, base, x in pts}
    for (label, name), (m, base, x) in by_pass.items():
        if label == "1b_offload" and ("1b", name) in by_pass and x:
            m0, base0, x0 = by_pass[("1b", name)]
            rows.append((0.0, x - x0, (m - m0) - (base - base0)))
    a = torch.tensor([r[:2] for r in rows], dtype=torch.float64)
    b = torch.tensor([r[2] for r in rows], dtype=torch.float64)
    overhead, adam = torch.linalg.lstsq(a, b.unsqueeze(1)).solution.squeeze(1).tolist()
    return overhead, adam


def main() -> None:
    pts = points()
    overhead, adam = fit(pts)
    print(f"role_pass_overhead_s = {overhead:.4f}  cpu_adam_s_per_param = {adam:.4g}")
    print(f"{'run':<11} {'pass':<14} {'measured':>8} {'fitted':>7} {'error':>7}")
    for label, name, measured, base, x in pts:
        fitted = base + overhead + adam * x
        print(f"{label:<11} {name:<14} {measured:8.3f} {fitted:7.3f} {(fitted - measured) / measured:+7.1%}")


if __name__ == "__main__":
    main()
