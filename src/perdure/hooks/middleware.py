"""Middleware: rewrite one model request without touching the agent's history."""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

from perdure.types import Message, ToolSpec

if TYPE_CHECKING:
    from perdure.agent.agent import Agent


class InvokeModelStage(enum.Enum):
    """Where in a model call a middleware runs."""

    Input = "input"
    """Before the request goes to the model: may replace messages, system prompt, tools."""


@dataclass
class InvokeModelContext:
    """The request of one model call, as middleware sees it.

    ``messages`` is a deep copy of the agent's history: a middleware may mutate it or
    assign a new list; whatever it leaves here is sent to the model for this call
    only. ``agent.messages`` and every store never see it.
    """

    agent: Agent
    messages: list[Message]
    system_prompt: str | None
    tool_specs: list[ToolSpec]
    cycle_index: int = 0


Middleware: TypeAlias = Callable[[InvokeModelContext], Awaitable[None] | None]


class MiddlewareRegistry:
    """Middleware per stage, run in registration order, each seeing the previous output."""

    def __init__(self) -> None:
        self._middleware: dict[InvokeModelStage, list[Middleware]] = {}

    def add_middleware(self, stage: InvokeModelStage, middleware: Middleware) -> None:
        """Run ``middleware(context)`` at ``stage`` of every model call.

        Raises:
            TypeError: ``stage`` is not an InvokeModelStage or ``middleware`` not callable.
        """
        if not isinstance(stage, InvokeModelStage):
            raise TypeError(f"stage must be an InvokeModelStage, got {stage!r}")
        if not callable(middleware):
            raise TypeError(f"middleware must be callable, got {middleware!r}")
        self._middleware.setdefault(stage, []).append(middleware)

    def has(self, stage: InvokeModelStage) -> bool:
        """True when some middleware runs at ``stage``."""
        return bool(self._middleware.get(stage))

    async def run(self, stage: InvokeModelStage, context: Any) -> None:
        """Run the middleware of ``stage`` on ``context`` in order."""
        for middleware in self._middleware.get(stage, []):
            outcome = middleware(context)
            if inspect.isawaitable(outcome):
                await outcome
