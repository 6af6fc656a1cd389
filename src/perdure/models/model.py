"""The Model protocol every adapter implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from perdure.models.stream import ModelStreamEvent
from perdure.types import Message, ToolSpec


@runtime_checkable
class Model(Protocol):
    """A chat model the agent loop can call.

    ``stream`` yields :class:`~perdure.models.stream.TextDelta` and friends as the
    answer arrives, and must end with exactly one
    :class:`~perdure.models.stream.ModelResponse` holding the whole assistant message,
    its stop reason and usage. Adapters translate perdure's Converse-style messages to
    their wire format and back, and map provider failures to
    :class:`~perdure.errors.ModelError` subclasses (a request too large for the
    context window → :class:`~perdure.errors.ContextWindowOverflowError`).

    The adapter must not mutate ``messages`` or ``tool_specs``.
    """

    def stream(
        self,
        messages: list[Message],
        *,
        tool_specs: list[ToolSpec],
        system_prompt: str | None,
    ) -> AsyncIterator[ModelStreamEvent]:
        """Stream one model call."""
        ...
