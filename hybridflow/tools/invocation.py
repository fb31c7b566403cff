"""Running the tool calls of one assistant turn. Whatever goes wrong (a malformed call, a tool the episode does
not offer, an exception, a timeout) becomes the text of the observation and a count under `tool_errors/<kind>`;
nothing raises into the rollout.

Timeouts: a call runs in a daemon thread and is abandoned after `timeout_s`; Python cannot stop a thread, so a
tool that may not return (code, network) runs its work in a child process it can kill
(hybridflow.tools.sandbox does), and the thread then ends with it.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from hybridflow.tools.record import ToolRecord
from hybridflow.tools.tool_call import MalformedCall, ToolCall, parse_tool_calls

# Error kinds, the suffixes of the `tool_errors/<kind>` metrics.
MALFORMED, UNKNOWN_TOOL, EXCEPTION, TIMEOUT, TOO_MANY_CALLS = (
    "malformed", "unknown_tool", "exception", "timeout", "too_many_calls")


@dataclass(frozen=True)
class ToolOutcome:
    """What the model reads for one call, and the error kind (None when the tool answered)."""

    content: str
    error: str | None = None


def _call_with_timeout(tool: ToolRecord, arguments: dict) -> ToolOutcome:
    result: list[ToolOutcome] = []

    def target() -> None:
        try:
            value = tool.call(arguments)
            result.append(ToolOutcome(value if isinstance(value, str) else str(value)))
        except Exception as err:  # a tool's failure is the model's observation, never the run's
            result.append(ToolOutcome(f"error: tool {tool.name} raised {type(err).__name__}: {err}", EXCEPTION))

    thread = threading.Thread(target=target, name=f"tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(tool.timeout_s)
    if not result:  # still running (result is appended before the thread ends)
        return ToolOutcome(f"error: tool {tool.name} did not answer within {tool.timeout_s:g} s", TIMEOUT)
    return result[0]


def invoke(call: ToolCall | MalformedCall, tools: Mapping[str, ToolRecord]) -> ToolOutcome:
    """The outcome of one parsed call against the tools this episode offers (by name)."""
    if isinstance(call, MalformedCall):
        return ToolOutcome(f"error: {call.reason}", MALFORMED)
    if call.name not in tools:
        offered = ", ".join(sorted(tools)) or "none"
        return ToolOutcome(f"error: unknown tool {call.name!r}; the tools are: {offered}", UNKNOWN_TOOL)
    return _call_with_timeout(tools[call.name], call.arguments)


@dataclass(frozen=True)
class TurnResults:
    """The outcomes of a turn's calls in order, and their metric counts (`tool_calls`, `tool_errors/<kind>`)."""

    outcomes: list[ToolOutcome]
    metrics: dict[str, int]


def run_turn_calls(text: str, tools: Mapping[str, ToolRecord], max_calls: int = 4) -> TurnResults:
    """Parse and run the tool calls in an assistant turn's sampled `text`; calls past `max_calls` are answered
    with an error instead of run (one turn's work stays bounded)."""
    counts: Counter[str] = Counter()
    outcomes = []
    for i, call in enumerate(parse_tool_calls(text)):
        outcome = (invoke(call, tools) if i < max_calls else
                   ToolOutcome(f"error: at most {max_calls} tool calls per turn; this one was not run", TOO_MANY_CALLS))
        counts["tool_calls"] += 1
        if outcome.error:
            counts[f"tool_errors/{outcome.error}"] += 1
        outcomes.append(outcome)
    return TurnResults(outcomes, dict(counts))
