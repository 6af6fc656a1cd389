"""The typed events ``agent.stream_async`` yields."""

from __future__ import annotations

from dataclasses import dataclass

from perdure.agent.checkpoint import Checkpoint
from perdure.agent.result import AgentResult
from perdure.tools import Interrupt
from perdure.types import Message, StopReason, ToolResult, ToolUse


@dataclass(frozen=True)
class AgentEvent:
    """Base of the events of ``agent.stream_async``."""


@dataclass(frozen=True)
class TextDeltaEvent(AgentEvent):
    """A piece of assistant text as the model streams it."""

    text: str


@dataclass(frozen=True)
class ReasoningDeltaEvent(AgentEvent):
    """A piece of the model's reasoning as it streams."""

    text: str


@dataclass(frozen=True)
class ModelMessageEvent(AgentEvent):
    """The model's complete message of one cycle, now part of the history."""

    message: Message
    stop_reason: StopReason


@dataclass(frozen=True)
class ToolStartEvent(AgentEvent):
    """A tool call starts."""

    tool_use: ToolUse


@dataclass(frozen=True)
class ToolEndEvent(AgentEvent):
    """A tool call finished with ``result`` (an error result when it raised)."""

    tool_use: ToolUse
    result: ToolResult


@dataclass(frozen=True)
class ToolInterruptedEvent(AgentEvent):
    """A tool call raised an interrupt and awaits the caller's response."""

    tool_use: ToolUse
    interrupt: Interrupt


@dataclass(frozen=True)
class CheckpointEvent(AgentEvent):
    """The loop paused at ``checkpoint``; the invocation ends right after."""

    checkpoint: Checkpoint


@dataclass(frozen=True)
class ResultEvent(AgentEvent):
    """The invocation's result; always the last event."""

    result: AgentResult
