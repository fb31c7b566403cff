"""Tool calls parsed from sampled text; every failure is an observation and a counted metric, never a raise."""

from __future__ import annotations

import time

from hybridflow.tools.invocation import TIMEOUT, run_turn_calls
from hybridflow.tools.record import ToolRecord
from hybridflow.tools.tool_call import MalformedCall, ToolCall, parse_tool_calls
from hybridflow.tools.truncation import truncate_middle


def test_parse_calls_closed_unclosed_and_string_arguments():
    text = ('Let me compute. <tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>'
            ' and <tool_call>{"name": "f", "arguments": "{\\"x\\": 3}"}')  # last block cut before its close
    assert parse_tool_calls(text) == [ToolCall("calculator", {"expression": "1+2"}), ToolCall("f", {"x": 3})]
    assert parse_tool_calls("no calls here, #### 3") == []


def test_malformed_blocks_say_what_is_wrong():
    bad = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": }</tool_call>'
                           '<tool_call>["f"]</tool_call><tool_call>{"name": "f", "arguments": [1]}</tool_call>')
    assert all(isinstance(call, MalformedCall) for call in bad)
    assert "not valid JSON" in bad[0].reason and '"name"' in bad[1].reason and "JSON object" in bad[2].reason


def _tool(name, call, timeout_s=5.0):
    return ToolRecord(name=name, description="", parameters={"type": "object"}, call=call, timeout_s=timeout_s)


def _raise(arguments):
    raise RuntimeError("disk on fire")


def test_failures_become_observations_and_counts():
    tools = {"boom": _tool("boom", _raise), "slow": _tool("slow", lambda a: time.sleep(30) or "late", 0.2),
             "echo": _tool("echo", lambda a: a["s"])}
    text = "".join(f"<tool_call>{body}</tool_call>" for body in (
        '{"name": "echo", "arguments": {"s": "hi"}}', '{"name": "nope", "arguments": {}}', '{"name": "boom"}',
        '{"name": "slow", "arguments": {}}', '{"name": "echo", "arguments": {"s": }', '{"name": "echo"}',
        '{"name": "echo", "arguments": {"s": "never run"}}'))
    start = time.monotonic()
    results = run_turn_calls(text, tools, max_calls=6)
    assert time.monotonic() - start < 5  # the slow tool was abandoned at its timeout
    contents = [o.content for o in results.outcomes]
    assert contents[0] == "hi"
    assert contents[1] == "error: unknown tool 'nope'; the tools are: boom, echo, slow"
    assert contents[2] == "error: tool boom raised RuntimeError: disk on fire"
    assert contents[3] == "error: tool slow did not answer within 0.2 s" and results.outcomes[3].error == TIMEOUT
    assert contents[4].startswith("error: the tool call is not valid JSON")
    assert contents[5] == "error: tool echo raised KeyError: 's'"  # missing argument: the tool's own error
    assert contents[6] == "error: at most 6 tool calls per turn; this one was not run"
    assert results.metrics == {"tool_calls": 7, "tool_errors/unknown_tool": 1, "tool_errors/exception": 2,
                               "tool_errors/timeout": 1, "tool_errors/malformed": 1, "tool_errors/too_many_calls": 1}


def test_truncate_middle_by_characters_keeps_head_and_tail():
    text = "".join(str(i % 10) for i in range(100))
    cut = truncate_middle(text, 10)
    assert cut == text[:5] + "\n[... 90 characters truncated ...]\n" + text[-5:]
    assert truncate_middle(text, 100) == text


class _WordTokenizer:
    """One token per space-separated word: an independent count to check the token arithmetic against."""

    def encode(self, text, add_special_tokens=False):
        return list(range(len(text.split(" "))))

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids)


def test_truncate_middle_by_tokens():
    tok = _WordTokenizer()
    tok.words = [f"w{i}" for i in range(20)]
    cut = truncate_middle(" ".join(tok.words), 5, tok)
    assert cut == "w0 w1 w2\n[... 15 tokens truncated ...]\nw18 w19"
