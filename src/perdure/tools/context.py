"""ToolContext: what a tool sees of the agent that called it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from perdure.state import AgentState
from perdure.types import ToolUse


@dataclass
class ToolContext:
    """Passed to a tool that declares a ``context`` parameter.

    Attributes:
        tool_use: the ``toolUse`` block being executed.
        agent: the agent running the tool.
        state: the agent's :class:`~perdure.state.AgentState` (shared, not a copy).
        invocation_state: a dict shared by every tool call of one invocation.
    """

    tool_use: ToolUse
    agent: Any
    state: AgentState
    invocation_state: dict[str, Any] = field(default_factory=dict)
    _interrupt: Callable[[ToolUse, str, Any], Any] | None = field(default=None, repr=False)

    def interrupt(self, name: str, reason: Any = None) -> Any:
        """Ask the caller for input.

        Returns the caller's response when the agent is resuming with an
        ``interruptResponse`` for this interrupt. Otherwise registers the interrupt and
        raises :class:`~perdure.tools.interrupt.InterruptException`, which stops the
        tool; the agent stops with ``stop_reason="interrupt"`` once the other tools of
        the cycle finish, and re-runs this tool when the caller answers.

        Raises:
            ValueError: ``name`` is not a non-empty string.
            RuntimeError: the context is not attached to an agent loop.
        """
        if not isinstance(name, str) or not name:
            raise ValueError("interrupt name must be a non-empty string")
        if self._interrupt is None:
            raise RuntimeError("this ToolContext is not attached to an agent loop")
        return self._interrupt(self.tool_use, name, reason)
