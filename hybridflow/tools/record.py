"""What a tool and an environment are to a multi-turn rollout: one record each, registered under its name.

A tool is a `ToolRecord`: its name, a description and a JSON schema of its arguments (what a chat template
renders from `tools=[record.schema()]`), and `call(arguments) -> str`. An environment (`EnvironmentRecord`)
reads each finished assistant turn and answers with the messages the model sees next; it may end the episode
and give the reward. User code registers its own with `register_tool` / `register_environment` before the run
starts; nothing else in hybridflow branches on their names.

Lookups by a configured name raise a one-line UserError listing the known names; a tool name the *model*
writes is looked up with `find_tool` (None when unknown), because a model's mistake is an observation, not
a configuration error (hybridflow.tools.invocation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hybridflow.registry import Registry

DEFAULT_TOOL_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ToolRecord:
    """A callable tool. `call` takes the parsed JSON arguments and returns the text the model sees; it may
    raise (reported to the model as a tool error). `timeout_s` bounds one call's wall time."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON schema of the arguments object
    call: Callable[[dict[str, Any]], str]
    timeout_s: float = DEFAULT_TOOL_TIMEOUT_S

    def schema(self) -> dict[str, Any]:
        """The OpenAI-style function schema chat templates render (`apply_chat_template(tools=[...])`)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


@dataclass(frozen=True)
class EnvironmentStep:
    """An environment's answer to one assistant turn: the messages appended for the model (each a
    `{role, content}` dict, all rendered at once: hybridflow.tools.observation_tokens), whether the episode
    ends, the reward when the environment gives one (None: the run's reward function scores it), and metric
    counts of this step (`tool_calls`, `tool_errors/<kind>`)."""

    messages: list[dict[str, str]]
    done: bool
    reward: float | None = None
    metrics: dict[str, int] = field(default_factory=dict)


class EnvironmentRecord(Protocol):
    """A multi-turn environment. `tools` are the registered tools it offers (their schemas go to the chat
    template); `step` sees the conversation so far (its last message the assistant's turn, as sampled text)
    and the dataset row, and never raises for anything the model wrote."""

    name: str
    tools: tuple[str, ...]

    def step(self, messages: list[dict[str, str]], row: Mapping[str, Any]) -> EnvironmentStep: ...


# The project's one registry convention (hybridflow/registry.py); the field names what a config will name.
_TOOLS: Registry[ToolRecord] = Registry("tool", "tool")
_ENVIRONMENTS: Registry[EnvironmentRecord] = Registry("environment", "rollout.environment")


def register_tool(record: ToolRecord) -> ToolRecord:
    """Make the tool `record.name` available to environments and rollouts."""
    return _TOOLS.add(record.name, record)


def get_tool(name: str) -> ToolRecord:
    """The registered tool `name` (UserError listing the known tools otherwise)."""
    return _TOOLS.get(name)


def find_tool(name: str) -> ToolRecord | None:
    """The registered tool `name`, or None (for names a model writes)."""
    return _TOOLS.get(name) if name in _TOOLS else None


def tool_names() -> tuple[str, ...]:
    return _TOOLS.names()


def register_environment(record: EnvironmentRecord) -> EnvironmentRecord:
    """Make the environment `record.name` available to rollouts."""
    return _ENVIRONMENTS.add(record.name, record)


def get_environment(name: str) -> EnvironmentRecord:
    """The registered environment `name` (UserError listing the known environments otherwise)."""
    return _ENVIRONMENTS.get(name)


def environment_names() -> tuple[str, ...]:
    return _ENVIRONMENTS.names()


def environment_tools(name: str | None) -> list[dict[str, Any]] | None:
    """The schemas of the tools environment `name` offers, as chat templates take them (`tools=`): prompts
    and observations are rendered with them. None for no environment (single turn) or one without tools."""
    if name is None:
        return None
    return [get_tool(tool).schema() for tool in get_environment(name).tools] or None
