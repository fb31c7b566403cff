"""Tools and environments for multi-turn rollouts (hybridflow.tools.record explains the records).

Importing this package registers the built-in tools (`calculator`, `python`) and environments (`calculator`:
the calculator tool offered to word problems). User code adds its own with `register_tool` /
`register_environment`.
"""

from hybridflow.tools.calculator import CALCULATOR
from hybridflow.tools.environment import ToolEnvironment
from hybridflow.tools.record import (
    EnvironmentRecord,
    EnvironmentStep,
    ToolRecord,
    environment_names,
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
    "find_tool",
    "get_environment",
    "get_tool",
    "register_environment",
    "register_tool",
    "tool_names",
]
