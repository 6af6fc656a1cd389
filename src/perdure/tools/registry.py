"""ToolRegistry: the tools one agent offers, by name, in registration order."""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator

from perdure.tools.agent_tool import AgentTool
from perdure.tools.decorator import DecoratedTool, tool
from perdure.types import ToolSpec

__all__ = ["ToolRegistry"]


class ToolRegistry:
    """Holds an agent's tools; names are unique.

    Accepts anything implementing :class:`AgentTool` (``@tool`` functions,
    :class:`PythonAgentTool`, your own classes) and plain functions, which are
    decorated with :func:`tool` on the way in. Iteration, :attr:`names` and
    :meth:`specs` follow registration order.
    """

    def __init__(self, tools: Iterable[object] = ()) -> None:
        """Register each of ``tools`` in order (see :meth:`register` for what may fail)."""
        self._tools: dict[str, AgentTool] = {}
        for item in tools:
            self.register(item)

    def register(self, tool_like: object) -> AgentTool:
        """Add a tool and return it (a plain function comes back decorated).

        Raises:
            ValueError: a tool of that name is already registered (the message names
                it), or a plain function cannot be made into a tool.
            TypeError: ``tool_like`` is neither an ``AgentTool`` nor a function (the
                message names it), or its ``tool_name`` is not a str.
        """
        registered = _as_agent_tool(tool_like)
        name = registered.tool_name
        if not isinstance(name, str):
            raise TypeError(f"tool {tool_like!r} has a tool_name that is not a str: {name!r}")
        if name in self._tools:
            raise ValueError(f"a tool named {name!r} is already registered")
        self._tools[name] = registered
        return registered

    def get(self, name: str) -> AgentTool | None:
        """Return the tool called ``name``, or ``None``."""
        return self._tools.get(name)

    @property
    def names(self) -> list[str]:
        """The tool names, in registration order."""
        return list(self._tools)

    def specs(self) -> list[ToolSpec]:
        """The specs of all tools, in registration order (copies, safe to change)."""
        return [registered.tool_spec for registered in self._tools.values()]

    def __contains__(self, item: object) -> bool:
        """``name in registry`` by name; ``a_tool in registry`` by identity."""
        if isinstance(item, str):
            return item in self._tools
        return any(registered is item for registered in self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __iter__(self) -> Iterator[AgentTool]:
        """Iterate over the tools (not the names), in registration order."""
        return iter(list(self._tools.values()))

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names!r})"


def _as_agent_tool(tool_like: object) -> AgentTool:
    if isinstance(tool_like, DecoratedTool | AgentTool):
        return tool_like
    if inspect.isroutine(tool_like):
        return tool(tool_like)
    raise TypeError(
        f"cannot register {tool_like!r} as a tool: expected an AgentTool "
        "(tool_name, tool_spec, invoke) or a function"
    )
