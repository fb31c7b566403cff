"""Why the search chose what it chose: predicted stage times, and for each runner-up why it lost."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hybridflow.placement.auto.overlap import OneStepOff
from hybridflow.placement.auto.search import Candidate, SearchResult
from hybridflow.placement.auto.set_solver import RoleChoice
from hybridflow.placement.auto.workload import GENERATION, STAGES
from hybridflow.role_records import Role
from hybridflow.units import GIB


def describe_sets(cand: Candidate) -> str:
    return " + ".join(f"{{{', '.join(s.roles)}}} x{s.gpus}" for s in cand.sets)


@dataclass
class RunnerUp:
    placement: str  # colocation sets and GPU counts, or the partition when nothing fits
    total_s: float | None  # None: does not fit
    stage_s: dict[str, float] = field(default_factory=dict)
    reason: str = ""


@dataclass
class Explanation:
    chosen: str
    total_s: float
    stage_s: dict[str, float]
    strategies: dict[str, str]  # role -> "tp.. pp.. dp.." (actor adds the rollout's layout)
    memory_gib: dict[str, float]  # colocation set -> GiB per GPU the estimator predicts
    why: str
    runners_up: list[RunnerUp]
    calibration: list[tuple[str, float, str]]  # (figure, value, source)
    stats: dict[str, int]
    one_step_off: OneStepOff | None = None  # rollout_lag=1: how generation overlaps the rest

    def format(self, limit: int = 6) -> str:
        lines = [f"auto placement: {self.chosen}   predicted {self.total_s:.1f} s / iteration",
                 "  " + "   ".join(f"{s} {t:.1f} s" for s, t in self.stage_s.items())]
        if self.one_step_off is not None:
            lines.append("  one step off (trainer.rollout_lag=1): the rollout generates batch k+1 on GPUs the "
                         "actor does not hold while batch k is prepared and trained: "
                         + overlap_text(self.one_step_off))
        lines += [f"  {role:<7} {text}" for role, text in self.strategies.items()]
        lines += [f"  memory {sets}: {gib:.2f} GiB/GPU" for sets, gib in self.memory_gib.items()]
        lines += ["why: " + self.why, "runners-up:"]
        for r in self.runners_up[:limit]:
            head = f"{r.total_s:.1f} s" if r.total_s is not None else "does not fit"
            lines.append(f"  {r.placement}: {head} - {r.reason}")
        assumed = [name for name, _, source in self.calibration if source.startswith("assumed")]
        lines.append(f"cost-model figures calibrated: {len(self.calibration) - len(assumed)} of "
                     f"{len(self.calibration)} (the rest are assumed defaults)")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"chosen": self.chosen, "total_s": self.total_s, "stage_s": self.stage_s,
                "one_step_off": asdict(self.one_step_off) if self.one_step_off is not None else None,
                "strategies": self.strategies, "memory_gib": self.memory_gib, "why": self.why,
                "runners_up": [r.__dict__ for r in self.runners_up],
                "calibration": [list(c) for c in self.calibration], "stats": self.stats}


def overlap_text(o: OneStepOff) -> str:
    """The terms of a one-step-off iteration, as the printouts show them."""
    return (f"max(generation {o.generate_s:.1f} s, preparation + training {o.consume_s:.1f} s) + scoring "
            f"{o.score_s:.1f} s + weight sync {o.sync_s:.1f} s")


def _label(choice: RoleChoice, gpus: int) -> str:
    s = choice.strategy
    if choice.role == Role.ROLLOUT:  # on GPUs of its own: its layout is the generation layout
        return f"gen tp{s.gen_tp} dp{s.gen_dp}  on {gpus} GPUs of its own, one step off"
    return s.label() + f"  on {gpus} GPUs"


def _actor_gpus(cand: Candidate) -> int:
    return next(s.gpus for s in cand.sets if Role.ACTOR in s.roles)


def stage_deltas(loser: Candidate, winner: Candidate) -> dict[str, float]:
    return {s: loser.stage_times[s] - winner.stage_times[s] for s in STAGES}


def _parts(loser: Candidate, winner: Candidate, stage: str, top: int = 3) -> str:
    """The cost components that differ most between the two plans' slowest sets in `stage`."""
    a, b = loser.bottleneck(stage).stage_parts(stage), winner.bottleneck(stage).stage_parts(stage)
    diffs = sorted(((k, a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b)), key=lambda kv: (-abs(kv[1]), kv[0]))
    shown = [f"{k.replace('_', ' ')} {d:+.1f}" for k, d in diffs[:top] if abs(d) >= 0.05]
    return f" [{', '.join(shown)}]" if shown else ""


def _loss_reason(loser: Candidate, winner: Candidate) -> str:
    """Name the stages where `loser` is slower, the set that holds it back, and the components why."""
    deltas = stage_deltas(loser, winner)
    parts = []
    for stage in sorted(STAGES, key=lambda s: -deltas[s]):
        if deltas[stage] <= 0.05:
            continue
        slow = loser.bottleneck(stage)
        detail = f"{{{', '.join(slow.roles)}}} on {slow.gpus} GPUs takes {slow.stage_time(stage):.1f} s"
        if stage == GENERATION and _actor_gpus(loser) < _actor_gpus(winner):
            detail += f" (the actor has {_actor_gpus(loser)} GPUs, not {_actor_gpus(winner)})"
        parts.append(f"{stage} +{deltas[stage]:.1f} s: {detail}{_parts(loser, winner, stage)}")
    gains = [f"{s} {deltas[s]:.1f} s" for s in STAGES if deltas[s] < -0.05]
    if loser.overlap is not None:  # stage maxima alone do not add up to the total at lag 1
        head = overlap_text(loser.overlap)
        return head + (": " + "; ".join(parts) if parts else "") + (f" (it gains {', '.join(gains)})" if gains else "")
    text = "; ".join(parts) if parts else "ties on every stage (kept the earlier candidate)"
    return text + (f" (it gains {', '.join(gains)})" if gains else "")


def _why_one_step_off(chosen: Candidate, others: list[Candidate]) -> str:
    o = chosen.overlap
    assert o is not None
    bound = "generation" if o.generate_s >= o.consume_s else "preparation + training"
    text = (f"one step off, {bound} bound: {overlap_text(o)}; the overlap hides {o.hidden_s:.1f} s that "
            "the stages would take one after another")
    if others:
        text += f"; the next best, {describe_sets(others[0])}, takes {others[0].total:.1f} s"
    return text


def _why(result: SearchResult) -> str:
    chosen = result.chosen
    others = [p.best for p in result.runners_up if p.best is not None]
    if chosen.overlap is not None:
        return _why_one_step_off(chosen, others)
    colocated = next((p for p in result.partitions if len(p.partition) == 1), None)
    if len(chosen.sets) > 1 and colocated is not None and colocated.best is None:
        # The constraint decided, not the cost model: say which, before any time comparison.
        text = f"colocating every role on all {result.world_size} GPUs is ruled out ({colocated.reason})"
        if others:
            return text + (f"; of the splits, this is the fastest (the next, {describe_sets(others[0])}, takes "
                           f"{others[0].total:.1f} s)")
        return text + "; this is the only split that fits"
    if not others:
        return "the only placement that fits memory"
    if len(chosen.sets) == 1:
        rival = others[0]
        d = stage_deltas(rival, chosen)
        saved = -sum(v for v in d.values() if v < 0)
        return (f"colocating every role wins: the best split ({describe_sets(rival)}) runs generation on "
                f"{_actor_gpus(rival)} GPUs instead of {_actor_gpus(chosen)} (+{d[GENERATION]:.1f} s"
                f"{_parts(rival, chosen, GENERATION)}) while its other sets idle, and its concurrent stages "
                f"save only {saved:.1f} s")
    rival = next((c for c in others if len(c.sets) == 1), others[0])
    d = stage_deltas(rival, chosen)
    gains = ", ".join(f"{s} {d[s]:.1f} s{_parts(rival, chosen, s)}" for s in STAGES if d[s] > 0.05)
    cost = -sum(v for v in d.values() if v < 0)
    return (f"splitting wins over {describe_sets(rival)}: its sets run their roles concurrently and save "
            f"{gains}; with all {result.world_size} GPUs each role's pass is short, so what does not shrink "
            "with more GPUs (pipeline fill/drain, the gradient sync of every optimizer step, the fixed cost "
            "of each pass) weighs, and colocated roles pay it one after another; the split pays "
            f"{cost:.1f} s elsewhere (generation and prefill on fewer GPUs)")


def explain(result: SearchResult) -> Explanation:
    """The chosen plan, its predicted stage times, and every other partition with why it lost."""
    chosen = result.chosen
    strategies = {c.role: _label(c, s.gpus) for s in chosen.sets for c in s.choices}
    memory = {"{" + ", ".join(s.roles) + "}": s.memory_bytes / GIB for s in chosen.sets}
    runners = []
    for p in result.runners_up:
        if p.best is None:
            runners.append(RunnerUp(" | ".join("{" + ", ".join(s) + "}" for s in p.partition), None,
                                    reason=p.reason))
        else:
            runners.append(RunnerUp(describe_sets(p.best), p.best.total, dict(p.best.stage_times),
                                    _loss_reason(p.best, chosen)))
    return Explanation(describe_sets(chosen), chosen.total, dict(chosen.stage_times), strategies, memory,
                       _why(result), runners, result.efficiency.report(), result.stats, chosen.overlap)
