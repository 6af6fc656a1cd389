"""What a model's stream yields: deltas as they arrive, then one complete response."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from perdure.types import Message, StopReason, Usage


def empty_usage() -> Usage:
    """A zeroed :class:`~perdure.types.Usage`."""
    return {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}


def add_usage(total: Usage, more: Usage) -> None:
    """Add ``more`` into ``total`` in place."""
    total["inputTokens"] += int(more.get("inputTokens", 0))
    total["outputTokens"] += int(more.get("outputTokens", 0))
    total["totalTokens"] += int(more.get("totalTokens", 0))


@dataclass(frozen=True)
class TextDelta:
    """A piece of assistant text, as it streams."""

    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    """A piece of the model's reasoning text, as it streams."""

    text: str


@dataclass(frozen=True)
class ToolUseDelta:
    """The model started (or continued) a tool call; ``input_fragment`` is raw JSON text."""

    tool_use_id: str
    name: str
    input_fragment: str = ""


@dataclass(frozen=True)
class ModelResponse:
    """The complete answer of one model call; always the last item of a stream.

    ``stop_reason`` is ``"tool_use"`` when the message carries ``toolUse`` blocks the
    loop must run, ``"end_turn"``/``"max_tokens"``/… otherwise.
    """

    message: Message
    stop_reason: StopReason
    usage: Usage = field(default_factory=empty_usage)


ModelStreamEvent: TypeAlias = TextDelta | ReasoningDelta | ToolUseDelta | ModelResponse
