"""Tool calls in a model's sampled text: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the
convention Qwen- and SmolLM-style chat templates teach. Parsing never raises: a block the model got wrong is a
`MalformedCall` whose `reason` becomes the observation it sees (hybridflow.tools.invocation)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# A closed block, or an unclosed last block (the engine stopped at max tokens, or on a stop string that it
# does not include in the sampled text).
_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: the tool's name and its arguments object."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class MalformedCall:
    """A `<tool_call>` block that is not a call; `reason` says what is wrong, for the model to read."""

    text: str
    reason: str


def _parse_block(body: str) -> ToolCall | MalformedCall:
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as err:
        return MalformedCall(body, f"the tool call is not valid JSON ({err.msg} at character {err.pos})")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return MalformedCall(body, 'the tool call must be a JSON object with a string "name"')
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments object as a JSON string
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as err:
            return MalformedCall(body, f'the "arguments" string is not valid JSON ({err.msg})')
    if not isinstance(arguments, dict):
        return MalformedCall(body, '"arguments" must be a JSON object')
    return ToolCall(payload["name"], arguments)


def parse_tool_calls(text: str) -> list[ToolCall | MalformedCall]:
    """Every `<tool_call>` block of `text` in order, parsed; an empty list when the turn calls no tool."""
    return [_parse_block(match.group(1).strip()) for match in _BLOCK.finditer(text)]
