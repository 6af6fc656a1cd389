"""AgentResult: what one invocation returns."""

from __future__ import annotations

from dataclasses import dataclass, field

from perdure.agent.checkpoint import Checkpoint
from perdure.models import empty_usage
from perdure.tools import Interrupt
from perdure.types import Message, StopReason, Usage


@dataclass
class AgentResult:
    """The outcome of one invocation.

    Attributes:
        stop_reason: why the loop stopped: ``"end_turn"``, ``"max_tokens"``,
            ``"checkpoint"``, ``"interrupt"``, ``"cancelled"``, ``"max_cycles"``, …
        message: the last assistant message of the invocation (empty when there was
            none).
        checkpoint: set when ``stop_reason == "checkpoint"``; pass it back in a
            ``checkpointResume`` block to go on.
        interrupts: the pending interrupts when ``stop_reason == "interrupt"``.
        usage: tokens summed over every model call of the invocation.
    """

    stop_reason: StopReason
    message: Message
    checkpoint: Checkpoint | None = None
    interrupts: list[Interrupt] = field(default_factory=list)
    usage: Usage = field(default_factory=empty_usage)

    def __str__(self) -> str:
        return "".join(block["text"] for block in self.message["content"] if "text" in block)
