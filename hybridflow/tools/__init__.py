"""Tools and environments for multi-turn rollouts (hybridflow.tools.record explains the records).

Importing this package registers the built-in tools (`calculator`, `python`) and environments (`calculator`:
the calculator tool offered to word problems). User code adds its own with `register_tool` /
`register_environment`.

An engine's turn loop drives them per trajectory (finished ones leave the batch, the others continue):
    env = get_environment(name); tools = [get_tool(t).schema() for t in env.tools]
    traj = TrajectoryTokens(render_ids(tok, messages, tools, add_generation_prompt=True), data.seq_length)
    loop up to max_turns: sample at most traj.room ids; traj.add_assistant(ids)
        messages.append({"role": "assistant", "content": tok.decode(ids, skip_special_tokens=True)})
        step = env.step(messages, row)   # metrics: step.metrics; reward: step.reward (None: reward fn)
        if step.done: stop
        replies = [{**m, "content": truncate_middle(m["content"], max_tool_tokens, tok)} for m in step.messages]
        if not traj.add_observation(observation_ids(tok, messages, ids, replies, tools)): stop (budget)
        messages += replies
The batch then takes traj.ids, traj.loss_mask and traj.segments; nothing is re-tokenized.
"""

from hybridflow.tools.calculator import CALCULATOR
from hybridflow.tools.environment import ToolEnvironment
from hybridflow.tools.record import (
    EnvironmentRecord,
    EnvironmentStep,
    ToolRecord,
    environment_names,
    environment_tools,
    find_tool,
    get_environment,
    get_tool,
    register_environment,
    register_tool,
    tool_names,
)
from hybridflow.tools.sandbox import PYTHON

register_tool(CALCULATOR)
register_tool(PYTHON)
register_environment(ToolEnvironment(name="calculator", tools=(CALCULATOR.name,)))

__all__ = [
    "EnvironmentRecord",
    "EnvironmentStep",
    "ToolEnvironment",
    "ToolRecord",
    "environment_names",
    "environment_tools",
    "find_tool",
    "get_environment",
    "get_tool",
    "register_environment",
    "register_tool",
    "tool_names",
]
