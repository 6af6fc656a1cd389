"""Plugins: objects that attach behaviour to an agent when it is built."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from perdure.agent.agent import Agent


@runtime_checkable
class Plugin(Protocol):
    """A named object that wires itself into an agent.

    ``init_agent`` runs once, during ``Agent(...)``, after the agent's tools, hooks
    and state exist; it typically registers hooks (``agent.hooks``), middleware
    (``agent.middleware``) or tools (``agent.tool_registry``). It may be a coroutine
    function; it then runs before the agent's first model call.
    """

    name: str

    def init_agent(self, agent: Agent) -> Awaitable[None] | None:
        """Wire the plugin into ``agent``."""
        ...
