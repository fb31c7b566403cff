"""`ToolEnvironment`: the environment of a tool-using episode. Each assistant turn's tool calls are run and
answered with one `tool` message per call; a turn without a tool call ends the episode, and the run's reward
function scores it (the environment gives no reward of its own)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hybridflow.tools.invocation import run_turn_calls
from hybridflow.tools.record import EnvironmentStep, get_tool

TOOL_ROLE = "tool"


@dataclass(frozen=True)
class ToolEnvironment:
    """Offers the registered tools `tools` (looked up when a step runs, so user tools registered after this
    record was made are found); at most `max_calls_per_turn` calls of a turn are run."""

    name: str
    tools: tuple[str, ...]
    max_calls_per_turn: int = 4

    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep:
        """Answer the last (assistant) message's tool calls; done when it has none."""
        offered = {name: get_tool(name) for name in self.tools}
        results = run_turn_calls(messages[-1]["content"], offered, self.max_calls_per_turn)
        if not results.outcomes:
            return EnvironmentStep(messages=[], done=True, metrics=results.metrics)
        replies = [{"role": TOOL_ROLE, "content": outcome.content} for outcome in results.outcomes]
        return EnvironmentStep(messages=replies, done=False, metrics=results.metrics)
