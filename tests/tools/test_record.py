"""Tools and environments are records registered by name; user code registers its own from outside the package."""

from __future__ import annotations

import pytest

from hybridflow.errors import UserError
from hybridflow.tools import (
    EnvironmentStep,
    ToolEnvironment,
    ToolRecord,
    environment_names,
    find_tool,
    get_environment,
    get_tool,
    register_environment,
    register_tool,
    tool_names,
)


def _reverse(arguments: dict) -> str:
    return arguments["text"][::-1]


REVERSE = ToolRecord(name="test_reverse", description="Reverse a string.",
                     parameters={"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
                     call=_reverse)


def test_user_tool_registered_from_test_module_is_found_and_served_by_an_environment():
    register_tool(REVERSE)
    register_tool(REVERSE)  # the same record again is harmless (a module imported twice)
    assert get_tool("test_reverse") is REVERSE and find_tool("test_reverse") is REVERSE
    assert {"calculator", "test_reverse"} <= set(tool_names())
    env = register_environment(ToolEnvironment(name="test_reverse_env", tools=("test_reverse", "calculator")))
    assert get_environment("test_reverse_env") is env and "test_reverse_env" in environment_names()
    turn = {"role": "assistant", "content": 'ok <tool_call>{"name": "test_reverse", "arguments": {"text": "abc"}}'
                                            '</tool_call><tool_call>{"name": "calculator", "arguments": '
                                            '{"expression": "6 * 7"}}</tool_call>'}
    step = env.step([{"role": "user", "content": "go"}, turn], row={})
    assert step == EnvironmentStep(messages=[{"role": "tool", "content": "cba"}, {"role": "tool", "content": "42"}],
                                   done=False, metrics={"tool_calls": 2})
    final = env.step([turn, {"role": "assistant", "content": "#### 42"}], row={})
    assert final.done and final.messages == [] and final.reward is None


def test_schema_is_the_function_form_chat_templates_render():
    assert REVERSE.schema() == {"type": "function", "function": {
        "name": "test_reverse", "description": "Reverse a string.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}


def test_unknown_name_is_one_line_listing_the_known_ones():
    with pytest.raises(UserError, match=r"^tool: 'nope' is unknown; use one of .*calculator"):
        get_tool("nope")
    with pytest.raises(UserError, match=r"^rollout.environment: 'nope' is unknown; use one of .*calculator"):
        get_environment("nope")
    assert find_tool("nope") is None


def test_a_name_cannot_be_taken_twice_by_different_records():
    other = ToolRecord(name="calculator", description="", parameters={}, call=lambda a: "")
    with pytest.raises(ValueError, match="register_tool: 'calculator' is registered already"):
        register_tool(other)
