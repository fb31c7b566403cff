"""`rollout.engine=auto`: plan the run with every registered engine and keep the one whose plan the cost
model predicts to take the shorter step.

An engine the plan refuses (a GPU-only engine on a cpu cluster, a vLLM budget that cannot hold the weights,
rollout_lag on an engine without it) is left out with its reason. The chosen plan carries the engine
(`Plan.rollout_engine`), so every rank builds what the planner chose; `choice.format()` says why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hybridflow.config.experiment import ExperimentConfig, check_parity_gate, with_engine
from hybridflow.engines import engine_names
from hybridflow.errors import UserError
from hybridflow.placement.auto import Explanation, search_placement
from hybridflow.placement.auto.from_config import plan_candidate
from hybridflow.placement.planner import Plan, build_plan, resolve_resources


@dataclass
class EngineChoice:
    """The engine `rollout.engine=auto` resolved to, its plan, and the figures it was chosen on."""

    chosen: str
    config: ExperimentConfig  # the experiment with rollout.engine (and its defaults) resolved
    plan: Plan
    explanation: Explanation | None  # placement.mode=auto: the search's own explanation of the chosen plan
    predicted_s: dict[str, float] = field(default_factory=dict)  # engine -> predicted step seconds
    stage_s: dict[str, dict[str, float]] = field(default_factory=dict)  # engine -> stage -> seconds
    refused: dict[str, str] = field(default_factory=dict)  # engine -> why its plan was refused

    def why(self) -> str:
        """One sentence: the winner against each other engine, with the stage that differs most."""
        best = self.predicted_s[self.chosen]
        parts = []
        for name, total in self.predicted_s.items():
            if name == self.chosen:
                continue
            deltas = {s: t - self.stage_s[self.chosen].get(s, 0.0) for s, t in self.stage_s[name].items()}
            stage = max(deltas, key=lambda s: abs(deltas[s]))
            parts.append(f"{name} {total:.2f} s ({stage} {deltas[stage]:+.2f} s)")
        parts += [f"{name} refused: {reason.split('; ')[0]}" for name, reason in self.refused.items()]
        return f"{self.chosen} predicts {best:.2f} s per step" + (f"; {'; '.join(parts)}" if parts else "")

    def format(self) -> str:
        return f"rollout engine (rollout.engine=auto): {self.chosen} - {self.why()}"

    def to_json(self) -> dict:
        return {"chosen": self.chosen, "predicted_s": self.predicted_s, "stage_s": self.stage_s,
                "refused": self.refused, "why": self.why()}


def choose_engine(cfg: ExperimentConfig) -> EngineChoice:
    """Plan `cfg` (rollout.engine=auto) with each registered engine; keep the fastest predicted step.

    Raises the one UserError naming every engine's reason when no engine can be planned.
    """
    planned: dict[str, tuple[ExperimentConfig, Plan, Explanation | None, float, dict[str, float]]] = {}
    refused: dict[str, str] = {}
    for name in engine_names():
        candidate = with_engine(cfg, name)
        try:
            if candidate.placement.mode == "auto":
                plan, explanation = search_placement(candidate)
                total, stages = explanation.total_s, dict(explanation.stage_s)
            else:
                plan, explanation = build_plan(candidate, resolve_resources(candidate)), None
                predicted = plan_candidate(candidate, plan)
                total, stages = predicted.total, dict(predicted.stage_times)
            check_parity_gate(candidate)  # after planning: an engine that cannot run here says that first
        except UserError as err:
            refused[name] = str(err)
            continue
        planned[name] = (candidate, plan, explanation, total, stages)
    if not planned:
        reasons = "; ".join(f"{name}: {reason}" for name, reason in refused.items())
        raise UserError(f"rollout.engine: auto found no engine that plans here ({reasons})")
    chosen = min(planned, key=lambda name: planned[name][3])  # ties: registration order (native first)
    config, plan, explanation, _, _ = planned[chosen]
    return EngineChoice(chosen, config, plan, explanation,
                        predicted_s={name: p[3] for name, p in planned.items()},
                        stage_s={name: p[4] for name, p in planned.items()}, refused=refused)
