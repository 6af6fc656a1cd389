"""Tools: ``@tool``, hand-written tools, the registry, and what a tool sees when it runs.

A tool is anything implementing :class:`AgentTool`. Most are typed functions made into
tools with :func:`tool`; :class:`PythonAgentTool` wraps a hand-written spec; a
:class:`ToolRegistry` holds an agent's tools by name.
"""

from perdure.tools.agent_tool import AgentTool
from perdure.tools.context import ToolContext
from perdure.tools.decorator import DecoratedTool, tool
from perdure.tools.interrupt import Interrupt, InterruptException, interrupt_id
from perdure.tools.python_tool import PythonAgentTool
from perdure.tools.registry import ToolRegistry
from perdure.tools.result import error_result, to_tool_result

__all__ = [
    "AgentTool",
    "DecoratedTool",
    "Interrupt",
    "InterruptException",
    "PythonAgentTool",
    "ToolContext",
    "ToolRegistry",
    "error_result",
    "interrupt_id",
    "to_tool_result",
    "tool",
]
