"""A user environment for the multi-turn run tests (imported through `imports=[...]`): the calculator
environment, except that a turn without a tool call before the last allowed one is answered with a tool
message asking for one, so every trajectory has several turns whatever the (small, untrained) model writes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow.tools import EnvironmentStep, ToolEnvironment, register_environment

NUDGE = "no tool call found; call the calculator"
NUDGED_TURNS = 2  # assistant turns answered with NUDGE at most; the third may end the episode


@dataclass(frozen=True)
class NudgedCalculator(ToolEnvironment):
    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep:
        step = super().step(messages, row)
        turns = sum(m["role"] == "assistant" for m in messages[len(row["prompt_messages"]):])
        if step.done and turns <= NUDGED_TURNS:
            return EnvironmentStep(messages=[{"role": "tool", "content": NUDGE}], done=False, metrics=step.metrics)
        return step


register_environment(NudgedCalculator(name="nudged_calculator", tools=("calculator",)))
