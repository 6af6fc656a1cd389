"""AgentTool: the protocol every tool the agent can run implements."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from perdure.tools.context import ToolContext
from perdure.types import ToolResult, ToolSpec, ToolUse


@runtime_checkable
class AgentTool(Protocol):
    """A tool the agent can offer to the model and run.

    ``@tool``-decorated functions (:class:`~perdure.tools.DecoratedTool`) and
    :class:`~perdure.tools.PythonAgentTool` implement it; any object with these three
    members does too.

    Contract of :meth:`invoke`:

    - it returns a ``ToolResult`` whose ``toolUseId`` equals ``tool_use["toolUseId"]``;
    - it MAY raise any exception: the agent's tool executor turns it into a
      ``toolResult`` with status ``"error"``, so the model sees what went wrong;
    - it MUST let :class:`~perdure.tools.InterruptException` propagate: that is how
      ``context.interrupt(...)`` pauses the agent.
    """

    @property
    def tool_name(self) -> str:
        """The name the model calls the tool by (``^[a-zA-Z0-9_-]{1,64}$``)."""
        ...

    @property
    def tool_spec(self) -> ToolSpec:
        """The name, description and JSON schema of the input that the model is shown."""
        ...

    async def invoke(self, tool_use: ToolUse, context: ToolContext) -> ToolResult:
        """Run the tool for one ``toolUse`` block and return its ``toolResult``."""
        ...
