"""PythonAgentTool: a tool from a hand-written spec and a ``(tool_use, context)`` function."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from perdure.tools.context import ToolContext
from perdure.tools.decorator import TOOL_NAME_PATTERN
from perdure.tools.result import to_tool_result
from perdure.types import ToolResult, ToolSpec, ToolUse

__all__ = ["PythonAgentTool"]


class PythonAgentTool:
    """A tool whose spec is written by hand and whose function gets the raw call.

    ``func(tool_use, context)`` may be sync or async and returns a ``ToolResult`` or
    any value, normalised with :func:`~perdure.tools.to_tool_result` (the result's
    ``toolUseId`` is always the call's). The input is passed as the model sent it:
    no validation against the spec's schema, no conversion. Sync functions run in a
    worker thread (``asyncio.to_thread``) so that they do not block the event loop.
    """

    def __init__(self, tool_spec: ToolSpec, func: Callable[[ToolUse, ToolContext], object]) -> None:
        """Check ``tool_spec`` and keep a deep copy of it.

        Raises:
            TypeError: ``tool_spec`` is not a dict, or ``func`` is not callable.
            ValueError: the spec's ``name`` is missing or does not match
                ``^[a-zA-Z0-9_-]{1,64}$``, its ``description`` is missing or not a
                str, or its ``inputSchema`` is not ``{"json": {...}}``.
        """
        _check_spec(tool_spec)
        if not callable(func):
            raise TypeError(f"func must be callable, got {type(func).__name__}")
        self._spec: ToolSpec = copy.deepcopy(tool_spec)
        self._func = func

    @property
    def tool_name(self) -> str:
        """The name from the spec."""
        return self._spec["name"]

    @property
    def tool_spec(self) -> ToolSpec:
        """The spec shown to the model (a fresh deep copy on every access)."""
        return copy.deepcopy(self._spec)

    async def invoke(self, tool_use: ToolUse, context: ToolContext) -> ToolResult:
        """Call ``func(tool_use, context)`` and normalise what it returns.

        Raises:
            InterruptException: the function called ``context.interrupt``; always
                propagated.
            Exception: whatever the function raises, unchanged.
        """
        if inspect.iscoroutinefunction(self._func):
            result: Any = await self._func(tool_use, context)
        else:
            result = await asyncio.to_thread(self._func, tool_use, context)
            if inspect.isawaitable(result):  # a callable object with an async __call__
                result = await result
        return to_tool_result(tool_use["toolUseId"], result)

    def __repr__(self) -> str:
        return f"<PythonAgentTool {self.tool_name!r}>"


def _check_spec(spec: object) -> None:
    if not isinstance(spec, Mapping):
        raise TypeError(f"tool_spec must be a dict, got {type(spec).__name__}")
    name = spec.get("name")
    if name is None:
        raise ValueError("tool_spec is missing 'name'")
    if not isinstance(name, str) or not TOOL_NAME_PATTERN.match(name):
        raise ValueError(
            f"tool_spec 'name' {name!r} must be a str matching {TOOL_NAME_PATTERN.pattern}"
        )
    description = spec.get("description")
    if not isinstance(description, str):
        raise ValueError(
            f"tool_spec {name!r}: 'description' must be a str, got {type(description).__name__}"
        )
    input_schema = spec.get("inputSchema")
    if not isinstance(input_schema, Mapping) or not isinstance(input_schema.get("json"), Mapping):
        raise ValueError(
            f"tool_spec {name!r}: 'inputSchema' must be {{'json': {{...}}}} holding the JSON "
            f"Schema of the input, got {input_schema!r}"
        )
