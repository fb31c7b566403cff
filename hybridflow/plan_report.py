"""An experiment's plan as `python -m hybridflow.plan` shows it and `Experiment.plan()` returns it: the placement,
the engine choice or auto search that led to it, the rollout's stop ids and the predicted step time."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hybridflow.algorithms import check_algorithm
from hybridflow.config import ExperimentConfig
from hybridflow.data.vocabulary import check_run_tokens, stop_ids_source
from hybridflow.engines import AUTO
from hybridflow.placement import Plan, plan_placement
from hybridflow.placement.auto import search_placement
from hybridflow.placement.auto.explain import Explanation, overlap_text
from hybridflow.placement.auto.from_config import plan_candidate
from hybridflow.placement.engine_choice import EngineChoice, choose_engine
from hybridflow.placement.report import format_plan
from hybridflow.training_run import checks_before_launch


@dataclass
class PlanReport:
    """A planned experiment. `config` is the experiment as planned (an `auto` engine resolved)."""

    config: ExperimentConfig
    plan: Plan
    stop_token_ids: list[int]
    stage_s: dict[str, float]
    predicted_step_s: float
    explanation: Explanation | None = None  # the auto search's (placement.mode=auto, rollout.engine=auto)
    choice: EngineChoice | None = None  # rollout.engine=auto: every engine planned, the faster kept
    overlap: Any = None  # the one-step-off prediction of an explicit plan, when it has one
    notes: list[str] = field(default_factory=list)  # the run's checks' notes (prompts dropped, data not here)

    def format(self) -> str:
        """The text `python -m hybridflow.plan` prints."""
        cfg = self.config
        lines = [f"experiment: {cfg.name}  model: {cfg.model.architecture} h={cfg.model.hidden_size} "
                 f"L={cfg.model.num_hidden_layers}  cluster: {cfg.cluster.gpu_type}", format_plan(self.plan)]
        if self.choice is not None:
            lines.append(self.choice.format())
        lines.append(self._stop_line())
        if self.explanation is not None:
            lines.append("\n" + self.explanation.format())
        else:
            stages = ", ".join(f"{name} {t:.1f} s" for name, t in self.stage_s.items())
            lines.append(f"\npredicted step time: {self.predicted_step_s:.1f} s ({stages}; cost model for "
                         f"{cfg.cluster.gpu_type})")
            if self.overlap is not None:
                lines.append(f"  one step off (trainer.rollout_lag=1): {overlap_text(self.overlap)}")
        return "\n".join(lines + self.notes)

    def _stop_line(self) -> str:
        """Where sampling stops; with `rollout.environment`, a limit is per assistant turn, not per response."""
        cfg, r = self.config, self.config.rollout
        if self.stop_token_ids:
            return f"rollout stops at token ids {self.stop_token_ids} ({stop_ids_source(cfg)})"
        if r.environment is None:
            return (f"rollout never stops early ({stop_ids_source(cfg)}): every response is "
                    f"rollout.max_new_tokens={r.max_new_tokens} tokens")
        return (f"rollout never stops early ({stop_ids_source(cfg)}): every assistant turn is "
                f"rollout.max_new_tokens={r.max_new_tokens} tokens (up to rollout.max_turns={r.max_turns} turns "
                f"per trajectory, within data.seq_length={cfg.data.seq_length} tokens)")

    def to_json(self) -> dict[str, Any]:
        """What plan.json holds."""
        return {"experiment": self.config.name, **self.plan.to_json(), "predicted_stage_s": self.stage_s,
                "stop_token_ids": self.stop_token_ids, "predicted_step_s": self.predicted_step_s,
                **({"auto": self.explanation.to_json()} if self.explanation else {}),
                **({"engine_choice": self.choice.to_json()} if self.choice else {})}


def plan_report(cfg: ExperimentConfig) -> PlanReport:
    """Plan `cfg` (its algorithm checked first) and predict its step time; needs no GPU."""
    check_algorithm(cfg)  # what the algorithm needs from the run (its record), before planning
    explanation, choice = None, None
    if cfg.rollout.engine == AUTO:
        choice = choose_engine(cfg)
        cfg, plan, explanation = choice.config, choice.plan, choice.explanation
    elif cfg.placement.mode == "auto":  # the search also explains itself: stage times and runners-up
        plan, explanation = search_placement(cfg)
    else:
        plan = plan_placement(cfg)
    stops = list(check_run_tokens(cfg).stop_token_ids)  # the tokenizer against model.vocab_size, the stop ids
    # The run's own checks (resume; data, tokenizer, reward), so that the run refuses nothing the planner accepted.
    # A dataset file not there yet (the 8B configs' prompts.jsonl) is said, not refused: a layout plans without it.
    absent = _absent_data(cfg)
    notes = checks_before_launch(cfg, plan, data=not absent)[1] + absent
    if explanation is not None:
        return PlanReport(cfg, plan, stops, dict(explanation.stage_s), explanation.total_s, explanation, choice,
                          notes=notes)
    predicted = plan_candidate(cfg, plan)
    return PlanReport(cfg, plan, stops, dict(predicted.stage_times), predicted.total, choice=choice,
                      overlap=predicted.overlap, notes=notes)


def _absent_data(cfg: ExperimentConfig) -> list[str]:
    """A note for each dataset file the config names that is not on this machine (none: every one is here)."""
    d = cfg.data
    files = {"data.source": d.source, **({"data.val_source": d.val_source} if d.val_source else {})}
    return [f"note: {field} {path!r} is not here; the data, tokenizer and reward were not checked (the run checks "
            "them before it starts)" for field, path in files.items()
            if not path.startswith("builtin:") and not Path(path).exists()]
